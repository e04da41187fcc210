nums = list(map(int, input().split()))
step = nums[1] - nums[0]
ok = all(b - a == step for a, b in zip(nums, nums[1:]))
print(ok)
print(step if ok else "no common step")
