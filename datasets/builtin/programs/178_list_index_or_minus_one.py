items = input().split()
x = input().strip()
print(items.index(x) if x in items else -1)
