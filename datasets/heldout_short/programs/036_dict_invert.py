pairs = [p.split("=") for p in input().split()]
d = {k: int(v) for k, v in pairs}
inv = {}
for k, v in d.items():
    inv.setdefault(v, []).append(k)
print(inv)
