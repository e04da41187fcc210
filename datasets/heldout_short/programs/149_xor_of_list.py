from functools import reduce

nums = list(map(int, input().split()))
print(reduce(lambda a, b: a ^ b, nums, 0))
