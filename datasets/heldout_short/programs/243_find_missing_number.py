nums = list(map(int, input().split()))
n = len(nums) + 1
print(n * (n + 1) // 2 - sum(nums))
