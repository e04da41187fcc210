nums = input().split()
k = int(input()) % len(nums)
print(" ".join(nums[k:] + nums[:k]))
