from functools import lru_cache


@lru_cache(maxsize=None)
def partitions(n, largest):
    if n == 0:
        return 1
    if n < 0 or largest == 0:
        return 0
    return partitions(n - largest, largest) + partitions(n, largest - 1)


n = int(input())
for k in range(n, n + 3):
    print(f"p({k}) = {partitions(k, k)}")
