from itertools import combinations

nums = list(map(int, input().split()))
target = int(input())
hits = [c for c in combinations(nums, 3) if sum(c) == target]
print(len(hits))
print(hits[0] if hits else None)
