def lower_bound(arr, target):
    lo, hi = 0, len(arr)
    steps = 0
    while lo < hi:
        mid = (lo + hi) // 2
        steps += 1
        if arr[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo, steps


data = input().split()
arr = sorted(int(x) for x in data)
queries = [int(x) for x in input().split()]
print("sorted:", arr)
found = 0
for q in queries:
    idx, steps = lower_bound(arr, q)
    if idx < len(arr) and arr[idx] == q:
        found += 1
        print(f"{q:4d}: found at index {idx} ({steps} steps)")
    else:
        print(f"{q:4d}: missing, would insert at {idx} ({steps} steps)")
print(f"found {found} of {len(queries)}")
for q in queries:
    idx, _ = lower_bound(arr, q)
    arr.insert(idx, q)
print("after inserting all:", arr)
