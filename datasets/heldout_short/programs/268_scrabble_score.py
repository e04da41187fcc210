values = {}
for letters, pts in [("aeilnorstu", 1), ("dg", 2), ("bcmp", 3), ("fhvwy", 4), ("k", 5), ("jx", 8), ("qz", 10)]:
    for ch in letters:
        values[ch] = pts
words = input().split()
scores = [sum(values[c] for c in w) for w in words]
print(scores)
print(words[scores.index(max(scores))])
