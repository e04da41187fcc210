a, b = input().split()
print(sorted(a) == sorted(b))
