seen = set()
dups = set()
for x in map(int, input().split()):
    if x in seen:
        dups.add(x)
    seen.add(x)
print(sorted(dups))
print(len(seen), "distinct")
