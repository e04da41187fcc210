d = dict(p.split("=") for p in input().split())
print(list(d.keys()))
print(list(d.values()))
