words = input().split()
print("".join(w[0].upper() for w in words))
