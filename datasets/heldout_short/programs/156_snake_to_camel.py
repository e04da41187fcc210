parts = input().strip().split("_")
print(parts[0] + "".join(p.capitalize() for p in parts[1:]))
