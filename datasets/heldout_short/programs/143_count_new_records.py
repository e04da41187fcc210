scores = list(map(int, input().split()))
records = 0
best = None
for s in scores:
    if best is None or s > best:
        best = s
        records += 1
print(records)
