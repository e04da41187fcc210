from collections import deque

k = int(input())
nums = [int(x) for x in input().split()]

maxq = deque()
minq = deque()
maxima, minima = [], []
for i, x in enumerate(nums):
    while maxq and nums[maxq[-1]] <= x:
        maxq.pop()
    maxq.append(i)
    while minq and nums[minq[-1]] >= x:
        minq.pop()
    minq.append(i)
    if maxq[0] <= i - k:
        maxq.popleft()
    if minq[0] <= i - k:
        minq.popleft()
    if i >= k - 1:
        maxima.append(nums[maxq[0]])
        minima.append(nums[minq[0]])

print("max:", maxima)
print("min:", minima)
spreads = [a - b for a, b in zip(maxima, minima)]
print("spread:", spreads)
widest = max(range(len(spreads)), key=spreads.__getitem__)
print(f"widest window starts at {widest}: {nums[widest:widest + k]}")

recent = deque(maxlen=k)
running = []
for x in nums:
    recent.append(x)
    running.append(round(sum(recent) / len(recent), 2))
print("moving avg:", running)
