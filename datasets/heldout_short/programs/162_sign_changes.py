nums = list(map(int, input().split()))
changes = 0
for a, b in zip(nums, nums[1:]):
    if (a < 0) != (b < 0):
        changes += 1
print(changes)
