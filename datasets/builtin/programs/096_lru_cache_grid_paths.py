from functools import lru_cache

rows, cols = map(int, input().split())
blocked = set()
for _ in range(int(input())):
    r, c = map(int, input().split())
    blocked.add((r, c))


@lru_cache(maxsize=None)
def paths(r, c):
    if (r, c) in blocked:
        return 0
    if r == 0 and c == 0:
        return 1
    total = 0
    if r > 0:
        total += paths(r - 1, c)
    if c > 0:
        total += paths(r, c - 1)
    return total


@lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


for r in range(rows):
    line = []
    for c in range(cols):
        cell = "X" if (r, c) in blocked else str(paths(r, c))
        line.append(f"{cell:>4}")
    print("".join(line))
answer = paths(rows - 1, cols - 1)
print("paths to corner:", answer)
info = paths.cache_info()
print("cache hits:", info.hits, "misses:", info.misses)
print("fib 30..34:", [fib(n) for n in range(30, 35)])
print("fib misses:", fib.cache_info().misses)
