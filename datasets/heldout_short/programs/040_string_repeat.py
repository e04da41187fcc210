s, k = input().split()
print(s * int(k))
