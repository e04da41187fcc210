parts = input().split(" ", 1)
print(parts)
