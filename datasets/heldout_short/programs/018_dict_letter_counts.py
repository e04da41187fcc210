s = input().strip()
counts = {}
for ch in s:
    counts[ch] = counts.get(ch, 0) + 1
print(sorted(counts.items()))
