lo, hi = map(int, input().split())
vals = list(map(int, input().split()))
print([min(max(v, lo), hi) for v in vals])
