lo, x, hi = map(int, input().split())
print(lo <= x <= hi, lo < hi < x)
