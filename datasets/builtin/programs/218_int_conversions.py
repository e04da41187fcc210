s = input().strip()
n = int(s, 16)
print(n, bin(n))
