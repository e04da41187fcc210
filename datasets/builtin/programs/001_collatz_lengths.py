def collatz_steps(n):
    steps = 0
    peak = n
    while n != 1:
        if n % 2 == 0:
            n = n // 2
        else:
            n = 3 * n + 1
        steps += 1
        if n > peak:
            peak = n
    return steps, peak


line = input().split()
lo = int(line[0])
hi = int(line[1])
best_n = lo
best_steps = -1
total = 0
for n in range(lo, hi + 1):
    steps, peak = collatz_steps(n)
    total += steps
    print(f"{n:3d}: steps={steps:3d} peak={peak}")
    if steps > best_steps:
        best_steps = steps
        best_n = n
count = hi - lo + 1
avg = total / count
print(f"longest chain starts at {best_n} with {best_steps} steps")
print(f"average steps: {avg:.2f}")
