names = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
start, offset = input().split()
print(names[(names.index(start) + int(offset)) % 7])
