a = input().strip()
b = input().strip()
print(sum(1 for x, y in zip(a, b) if x != y))
