items = input().split()
items.insert(0, "a")
items.extend(["d", "e"])
print(items, len(items))
