import sys
from collections import defaultdict

data = sys.stdin.read().split()
n = int(data[0])
nums = [int(x) for x in data[1:n + 1]]
targets = [int(x) for x in data[n + 1:]]
print("numbers:", nums)
for target in targets:
    seen = {}
    pairs = set()
    first_hit = None
    for idx, value in enumerate(nums):
        need = target - value
        if need in seen:
            a, b = sorted((value, need))
            pairs.add((a, b))
            if first_hit is None:
                first_hit = (seen[need], idx)
        seen[value] = idx
    ordered = sorted(pairs)
    prefix_count = defaultdict(int)
    prefix_count[0] = 1
    running = 0
    windows = 0
    for value in nums:
        running += value
        windows += prefix_count[running - target]
        prefix_count[running] += 1
    if ordered:
        print(f"target {target}: pairs {ordered}, first indices {first_hit}")
    else:
        print(f"target {target}: no pairs")
    print(f"   contiguous runs summing to {target}: {windows}")
values = set(nums)
missing = sorted(set(range(min(nums), max(nums) + 1)) - values)
print("gaps in range:", missing)
