nums = list(map(int, input().split()))
print(nums)
nums.sort()
print(nums)
