words = input().split()
print("".join(w[i] if i < len(w) else "_" for i, w in enumerate(words)))
