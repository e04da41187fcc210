parts = input().split()
print(parts[0])
print(parts[-1])
