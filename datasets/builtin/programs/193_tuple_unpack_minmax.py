def minmax(values):
    return min(values), max(values)


lo, hi = minmax(list(map(int, input().split())))
print(lo, hi)
