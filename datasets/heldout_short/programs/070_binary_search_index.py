arr = list(map(int, input().split()))
target = int(input())
lo, hi = 0, len(arr) - 1
pos = -1
while lo <= hi:
    mid = (lo + hi) // 2
    if arr[mid] == target:
        pos = mid
        break
    if arr[mid] < target:
        lo = mid + 1
    else:
        hi = mid - 1
print(pos)
