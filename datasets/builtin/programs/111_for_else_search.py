def first_divisor(n):
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return d
    return None


queries = list(map(int, input().split()))
for n in queries:
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            print(f"{n} is composite (divisible by {d})")
            break
    else:
        print(f"{n} is prime" if n > 1 else f"{n} is neither")

target = int(input())
matrix = [list(map(int, input().split())) for _ in range(3)]
for r, row in enumerate(matrix):
    for c, value in enumerate(row):
        if value == target:
            print(f"found {target} at row {r}, col {c}")
            break
    else:
        continue
    break
else:
    print(f"{target} not in matrix")

gap_start = None
prev = None
largest_gap = 0
for n in range(2, 120):
    if first_divisor(n) is not None:
        continue
    if prev is not None and n - prev > largest_gap:
        largest_gap = n - prev
        gap_start = prev
    prev = n
print(f"largest prime gap below 120: {largest_gap} after {gap_start}")
