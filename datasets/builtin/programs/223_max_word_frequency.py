words = input().split()
freq = {}
for w in words:
    freq[w] = freq.get(w, 0) + 1
best = max(freq.items(), key=lambda kv: kv[1])
print(best)
