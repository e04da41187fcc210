def kadane(arr):
    best = arr[0]
    best_start = best_end = 0
    current = 0
    start = 0
    for i, v in enumerate(arr):
        if current <= 0:
            current = v
            start = i
        else:
            current += v
        if current > best:
            best = current
            best_start = start
            best_end = i
    return best, best_start, best_end


def brute(arr):
    prefix = [0]
    for v in arr:
        prefix.append(prefix[-1] + v)
    best = arr[0]
    for i in range(len(arr)):
        for j in range(i + 1, len(arr) + 1):
            best = max(best, prefix[j] - prefix[i])
    return best


cases = int(input())
for case in range(1, cases + 1):
    arr = list(map(int, input().split()))
    best, lo, hi = kadane(arr)
    check = brute(arr)
    segment = arr[lo:hi + 1]
    print(f"case {case}: max sum {best} on [{lo}, {hi}] -> {segment}")
    print(f"         brute force agrees: {best == check}")
