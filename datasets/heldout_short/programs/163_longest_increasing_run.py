nums = list(map(int, input().split()))
best = cur = 1
end = 0
for i in range(1, len(nums)):
    if nums[i] > nums[i - 1]:
        cur += 1
    else:
        cur = 1
    if cur > best:
        best = cur
        end = i
print(best)
print(nums[end - best + 1:end + 1])
