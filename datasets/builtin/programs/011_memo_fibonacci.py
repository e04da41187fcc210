def make_fib():
    cache = {0: 0, 1: 1}
    calls = 0

    def fib(n):
        nonlocal calls
        calls += 1
        if n in cache:
            return cache[n]
        value = fib(n - 1) + fib(n - 2)
        cache[n] = value
        return value

    def stats():
        return calls, len(cache)

    return fib, stats


fib, stats = make_fib()
queries = [int(x) for x in input().split()]
mod = int(input())
for q in queries:
    value = fib(q)
    calls, size = stats()
    print(f"fib({q:2d}) = {value:>10} mod {mod} = {value % mod:<4} calls so far: {calls}")
total_calls, cache_size = stats()
digits = len(str(fib(max(queries))))
print("cache entries:", cache_size)
print("total calls:", total_calls)
print("digits in largest:", digits)
