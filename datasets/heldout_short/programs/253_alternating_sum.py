nums = list(map(int, input().split()))
total = 0
for i, x in enumerate(nums):
    total += x if i % 2 == 0 else -x
print(total)
