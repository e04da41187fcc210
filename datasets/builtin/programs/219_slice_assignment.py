nums = input().split()
nums[1:3] = ["x"]
print(nums)
