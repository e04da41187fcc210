nums = list(map(int, input().split()))
target = int(input())
seen = {}
answer = None
for i, x in enumerate(nums):
    if target - x in seen:
        answer = (seen[target - x], i)
        break
    seen[x] = i
print(answer)
