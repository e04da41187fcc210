lo, hi = map(int, input().split())
primes = [n for n in range(max(2, lo), hi + 1) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
gap, a, b = max((b - a, a, b) for a, b in zip(primes, primes[1:]))
print(len(primes), "primes")
print("gap", gap)
print("between", a, "and", b)
