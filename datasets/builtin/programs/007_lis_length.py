import sys
from bisect import bisect_left

data = sys.stdin.read().split()
n = int(data[0])
nums = [int(x) for x in data[1:1 + n]]
dp = [1] * n
parent = [-1] * n
for i in range(n):
    for j in range(i):
        if nums[j] < nums[i] and dp[j] + 1 > dp[i]:
            dp[i] = dp[j] + 1
            parent[i] = j
best = max(dp)
end = dp.index(best)
seq = []
while end != -1:
    seq.append(nums[end])
    end = parent[end]
seq.reverse()

tails = []
for value in nums:
    pos = bisect_left(tails, value)
    if pos == len(tails):
        tails.append(value)
    else:
        tails[pos] = value
print("sequence:", nums)
print("dp table:", dp)
print("LIS length:", best)
print("one LIS:", " < ".join(map(str, seq)))
print("patience tails:", tails, "length", len(tails))
