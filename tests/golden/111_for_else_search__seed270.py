def first_divisor(n):
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return d
    return None
queries = list(map(int, input().split()))
print('__DBG_0__', repr(queries) if isinstance(queries, (int, float, str, bool, type(None))) else type(queries).__name__)
for n in queries:
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            print(f'{n} is composite (divisible by {d})')
            break
        print('__DBG_1__', repr(queries) if isinstance(queries, (int, float, str, bool, type(None))) else type(queries).__name__, repr(d) if isinstance(d, (int, float, str, bool, type(None))) else type(d).__name__, repr(n) if isinstance(n, (int, float, str, bool, type(None))) else type(n).__name__)
    else:
        print(f'{n} is prime' if n > 1 else f'{n} is neither')
target = int(input())
print('__DBG_2__', repr(d) if isinstance(d, (int, float, str, bool, type(None))) else type(d).__name__, repr(target) if isinstance(target, (int, float, str, bool, type(None))) else type(target).__name__)
matrix = [list(map(int, input().split())) for _ in range(3)]
for r, row in enumerate(matrix):
    for c, value in enumerate(row):
        if value == target:
            print(f'found {target} at row {r}, col {c}')
            break
        print('__DBG_3__', repr(d) if isinstance(d, (int, float, str, bool, type(None))) else type(d).__name__, repr(c) if isinstance(c, (int, float, str, bool, type(None))) else type(c).__name__, repr(row) if isinstance(row, (int, float, str, bool, type(None))) else type(row).__name__)
    else:
        continue
    break
else:
    print(f'{target} not in matrix')
gap_start = None
print('__DBG_4__', repr(r) if isinstance(r, (int, float, str, bool, type(None))) else type(r).__name__)
prev = None
print('__DBG_5__', repr(prev) if isinstance(prev, (int, float, str, bool, type(None))) else type(prev).__name__, repr(queries) if isinstance(queries, (int, float, str, bool, type(None))) else type(queries).__name__, repr(d) if isinstance(d, (int, float, str, bool, type(None))) else type(d).__name__)
largest_gap = 0
for n in range(2, 120):
    if first_divisor(n) is not None:
        continue
    if prev is not None and n - prev > largest_gap:
        largest_gap = n - prev
        gap_start = prev
    prev = n
print(f'largest prime gap below 120: {largest_gap} after {gap_start}')
