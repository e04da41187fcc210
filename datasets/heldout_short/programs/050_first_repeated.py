seen = set()
found = None
for x in input().split():
    if x in seen:
        found = x
        break
    seen.add(x)
print(found)
