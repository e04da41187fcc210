a, b = map(int, input().split())
print(a // b, a % b)
print(round(a / b, 4))
