words = input().split()
print(" ".join(w[::-1] for w in words))
