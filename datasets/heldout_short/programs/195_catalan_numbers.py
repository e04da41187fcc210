from functools import lru_cache


@lru_cache(maxsize=None)
def catalan(n):
    if n <= 1:
        return 1
    return sum(catalan(i) * catalan(n - 1 - i) for i in range(n))


n = int(input())
print([catalan(i) for i in range(n)])
