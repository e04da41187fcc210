nums = sorted(set(map(int, input().split())), reverse=True)
print(nums[1] if len(nums) > 1 else None)
