d = dict(p.split(":") for p in input().split())
print(sorted(d, key=lambda k: int(d[k])))
