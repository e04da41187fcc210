import sys


def divisor_sum(n):
    if n == 1:
        return 0
    total = 1
    d = 2
    while d * d <= n:
        if n % d == 0:
            total += d
            other = n // d
            if other != d:
                total += other
        d += 1
    return total


def digits_power_sum(n):
    text = str(n)
    return sum(int(ch) ** len(text) for ch in text)


lo, hi = map(int, sys.stdin.readline().split())
buckets = {"perfect": [], "abundant": [], "deficient": []}
armstrong = []
for n in range(lo, hi + 1):
    s = divisor_sum(n)
    if s == n:
        buckets["perfect"].append(n)
    elif s > n:
        buckets["abundant"].append(n)
    else:
        buckets["deficient"].append(n)
    if digits_power_sum(n) == n:
        armstrong.append(n)

for kind, nums in buckets.items():
    preview = nums[:8]
    more = f" ... (+{len(nums) - 8})" if len(nums) > 8 else ""
    print(f"{kind:<9} {len(nums):>3}: {preview}{more}")
print("armstrong:", armstrong)
pairs = []
for a in range(lo, hi + 1):
    b = divisor_sum(a)
    if a < b <= hi and divisor_sum(b) == a:
        pairs.append((a, b))
print("amicable pairs:", pairs)
