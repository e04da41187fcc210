rows = [input().split() for _ in range(3)]
flat = [int(x) for row in rows for x in row]
print(len(flat))
print(sorted(set(flat)))
