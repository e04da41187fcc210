nums = sorted(map(int, input().split()))
gaps = [b - a for a, b in zip(nums, nums[1:])]
print(min(gaps))
