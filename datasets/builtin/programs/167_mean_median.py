nums = sorted(map(int, input().split()))
print(sum(nums) / len(nums))
print(nums[len(nums) // 2])
