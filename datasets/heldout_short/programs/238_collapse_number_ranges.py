nums = sorted(map(int, input().split()))
parts = []
start = prev = nums[0]
for n in nums[1:] + [None]:
    if n is not None and n == prev + 1:
        prev = n
        continue
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    if n is not None:
        start = prev = n
print(",".join(parts))
