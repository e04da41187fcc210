nums = list(map(int, input().split()))
print([b - a for a, b in zip(nums, nums[1:])])
