from itertools import accumulate
import operator

values = list(map(int, input().split()))
prefix = list(accumulate(values))
running_max = list(accumulate(values, max))
running_min = list(accumulate(values, min))
products = list(accumulate(values, operator.mul))
print("values:  ", values)
print("prefix:  ", prefix)
print("run max: ", running_max)
print("run min: ", running_min)
print("products:", products)

table = [0] + prefix
q = int(input())
for _ in range(q):
    lo, hi = map(int, input().split())
    segment = table[hi + 1] - table[lo]
    length = hi - lo + 1
    print(f"sum[{lo}..{hi}] = {segment:>4}  avg = {segment / length:.2f}")

best = values[0]
current = 0
for v in values:
    current = max(v, current + v)
    best = max(best, current)
print("max subarray:", best)
