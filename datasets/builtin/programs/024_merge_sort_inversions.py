import sys


def sort_count(arr):
    if len(arr) <= 1:
        return arr, 0
    mid = len(arr) // 2
    left, inv_left = sort_count(arr[:mid])
    right, inv_right = sort_count(arr[mid:])
    merged = []
    i = j = 0
    inversions = inv_left + inv_right
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            merged.append(left[i])
            i += 1
        else:
            merged.append(right[j])
            inversions += len(left) - i
            j += 1
    merged.extend(left[i:])
    merged.extend(right[j:])
    return merged, inversions


for line in sys.stdin:
    nums = [int(tok) for tok in line.split()]
    if not nums:
        continue
    ordered, inv = sort_count(nums)
    n = len(nums)
    max_inv = n * (n - 1) // 2
    sortedness = 1 - inv / max_inv if max_inv else 1.0
    print(f"input  : {nums}")
    print(f"sorted : {ordered}")
    print(f"inversions = {inv} of {max_inv} (sortedness {sortedness:.1%})")
