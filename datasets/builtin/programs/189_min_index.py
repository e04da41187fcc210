nums = list(map(int, input().split()))
m = min(nums)
print(m, nums.index(m))
