items = input().split()
print(items[0], items[-1])
print(items[len(items) // 2])
