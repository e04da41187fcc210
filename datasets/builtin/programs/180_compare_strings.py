a, b = input().split()
print(a < b, len(a) == len(b))
