def parse(line):
    return {k: int(v) for k, v in (p.split(":") for p in line.split())}


d1 = parse(input())
d2 = parse(input())
merged = dict(d1)
for k, v in d2.items():
    merged[k] = merged.get(k, 0) + v
print(merged)
