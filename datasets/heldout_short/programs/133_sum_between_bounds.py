lo, hi = map(int, input().split())
print(sum(range(lo, hi + 1)))
