nums = list(map(int, input().split()))
k = int(input())
print(sorted(nums)[k - 1])
