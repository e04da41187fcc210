import sys

input = sys.stdin.readline
n, q = map(int, input().split())
arr = list(map(int, input().split()))
prefix = [0] * (n + 1)
for i in range(n):
    prefix[i + 1] = prefix[i] + arr[i]
print("prefix:", prefix)
best_sum = None
best_range = None
for _ in range(q):
    left, right = map(int, input().split())
    seg = prefix[right] - prefix[left - 1]
    length = right - left + 1
    mean = seg / length
    print(f"sum[{left}..{right}] = {seg:4d}  mean = {mean:.3f}")
    if best_sum is None or seg > best_sum:
        best_sum = seg
        best_range = (left, right)
print("largest query sum:", best_sum, "on", best_range)
