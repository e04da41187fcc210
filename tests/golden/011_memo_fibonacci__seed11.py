def make_fib():
    cache = {0: 0, 1: 1}
    print('__DBG_0__', repr(cache) if isinstance(cache, (int, float, str, bool, type(None))) else type(cache).__name__)
    calls = 0
    print('__DBG_1__', repr(cache) if isinstance(cache, (int, float, str, bool, type(None))) else type(cache).__name__)

    def fib(n):
        nonlocal calls
        calls += 1
        if n in cache:
            return cache[n]
        value = fib(n - 1) + fib(n - 2)
        cache[n] = value
        print('__DBG_2__', repr(n) if isinstance(n, (int, float, str, bool, type(None))) else type(n).__name__, repr(cache) if isinstance(cache, (int, float, str, bool, type(None))) else type(cache).__name__)
        return value

    def stats():
        return (calls, len(cache))
    return (fib, stats)
fib, stats = make_fib()
print('__DBG_3__', repr(stats) if isinstance(stats, (int, float, str, bool, type(None))) else type(stats).__name__)
queries = [int(x) for x in input().split()]
mod = int(input())
for q in queries:
    value = fib(q)
    calls, size = stats()
    print('__DBG_4__', repr(stats) if isinstance(stats, (int, float, str, bool, type(None))) else type(stats).__name__)
    print(f'fib({q:2d}) = {value:>10} mod {mod} = {value % mod:<4} calls so far: {calls}')
total_calls, cache_size = stats()
print('__DBG_5__', repr(mod) if isinstance(mod, (int, float, str, bool, type(None))) else type(mod).__name__)
digits = len(str(fib(max(queries))))
print('cache entries:', cache_size)
print('total calls:', total_calls)
print('digits in largest:', digits)
