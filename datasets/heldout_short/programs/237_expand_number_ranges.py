out = []
for part in input().split(","):
    if "-" in part:
        lo, hi = map(int, part.split("-"))
        out.extend(range(lo, hi + 1))
    else:
        out.append(int(part))
print(out)
print(len(out), sum(out))
