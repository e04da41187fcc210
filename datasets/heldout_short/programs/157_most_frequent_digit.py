digits = input().strip()
counts = [0] * 10
for d in digits:
    counts[int(d)] += 1
best = counts.index(max(counts))
print(best)
print(counts[best])
