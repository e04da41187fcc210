seen = []
for x in input().split():
    if x not in seen:
        seen.append(x)
print(" ".join(seen))
