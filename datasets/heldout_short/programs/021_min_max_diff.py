nums = list(map(int, input().split()))
print(max(nums) - min(nums))
