items = input().split()
target = input().strip()
where = [i for i, x in enumerate(items) if x == target]
print(where)
