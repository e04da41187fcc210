nums = [int(x) for x in input().split()]
best = nums[0]
for x in nums[1:]:
    if x > best:
        best = x
print(best)
print(nums.index(best))
