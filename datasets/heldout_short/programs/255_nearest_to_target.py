target = int(input())
nums = list(map(int, input().split()))
print(min(nums, key=lambda x: (abs(x - target), x)))
