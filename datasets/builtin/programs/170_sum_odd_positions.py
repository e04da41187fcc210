nums = list(map(int, input().split()))
print(sum(nums[1::2]), sum(nums[::2]))
