from functools import lru_cache

steps_allowed = tuple(int(x) for x in input().split())
broken = set(int(x) for x in input().split())
heights = [int(x) for x in input().split()]


@lru_cache(maxsize=None)
def ways(n):
    if n == 0:
        return 1
    if n < 0 or n in broken:
        return 0
    total = 0
    for s in steps_allowed:
        total += ways(n - s)
    return total


def ways_iterative(n):
    table = [0] * (n + 1)
    table[0] = 1
    for i in range(1, n + 1):
        if i in broken:
            continue
        for s in steps_allowed:
            if i - s >= 0:
                table[i] += table[i - s]
    return table[n]


print("step sizes:", list(steps_allowed))
print("broken stairs:", sorted(broken))
for h in heights:
    a = ways(h)
    b = ways_iterative(h)
    print(f"height {h:2d}: {a:6d} ways  (iterative {'matches' if a == b else 'differs'})")
info = ways.cache_info()
print("cache size:", info.currsize)
