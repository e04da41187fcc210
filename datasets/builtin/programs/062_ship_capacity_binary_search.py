def days_needed(weights, capacity):
    days = 1
    load = 0
    for w in weights:
        if load + w > capacity:
            days += 1
            load = 0
        load += w
    return days


def min_capacity(weights, max_days):
    lo = max(weights)
    hi = sum(weights)
    probes = []
    while lo < hi:
        mid = (lo + hi) // 2
        probes.append(mid)
        if days_needed(weights, mid) <= max_days:
            hi = mid
        else:
            lo = mid + 1
    return lo, probes


weights = list(map(int, input().split()))
day_limits = list(map(int, input().split()))
print("packages:", weights, "total", sum(weights))
for limit in day_limits:
    cap, probes = min_capacity(weights, limit)
    used = days_needed(weights, cap)
    print(f"within {limit} days: capacity {cap} (uses {used} days), probes {probes}")
