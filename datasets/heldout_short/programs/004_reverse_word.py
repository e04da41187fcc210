w = input().strip()
print(w[::-1])
