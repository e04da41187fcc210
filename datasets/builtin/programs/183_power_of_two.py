n = int(input())
print(n > 0 and n & (n - 1) == 0)
