from itertools import accumulate

nums = list(map(int, input().split()))
print(list(accumulate(nums, max)))
