import sys

numbers = [int(x) for x in sys.stdin.readline().split()]
cap = int(sys.stdin.readline())

results = []
for start in numbers:
    if start <= 0:
        print(f"{start}: skipped (not positive)")
        continue
    n = start
    steps = 0
    peak = n
    while n != 1:
        if steps >= cap:
            break
        if n % 2 == 0:
            n //= 2
        else:
            n = 3 * n + 1
        steps += 1
        peak = max(peak, n)
    else:
        results.append((steps, start))
        print(f"{start}: {steps} steps, peak {peak}")
        continue
    print(f"{start}: gave up after {cap} steps at {n}")

longest = max(results)
print("longest chain:", longest[1], "with", longest[0], "steps")
i = 1
while True:
    i += 1
    m, count = i, 0
    while m != 1:
        m = m // 2 if m % 2 == 0 else 3 * m + 1
        count += 1
    if count > 100:
        break
print("first start needing over 100 steps:", i)
