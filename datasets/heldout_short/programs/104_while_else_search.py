nums = list(map(int, input().split()))
target = int(input())
i = 0
while i < len(nums):
    if nums[i] == target:
        print("found at", i)
        break
    i += 1
else:
    print("missing")
