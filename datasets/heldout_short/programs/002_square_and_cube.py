n = int(input())
print(n * n)
print(n ** 3)
