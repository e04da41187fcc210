n = int(input())
nums = list(range(n))
print(nums[::2], nums[1::2][::-1])
