nums = list(map(int, input().split()))
print(min(nums))
print(max(nums))
print(sum(nums))
