def sieve(limit):
    is_prime = [True] * (limit + 1)
    is_prime[0] = False
    is_prime[1] = False
    p = 2
    while p * p <= limit:
        if is_prime[p]:
            for multiple in range(p * p, limit + 1, p):
                is_prime[multiple] = False
        p += 1
    return [i for i, flag in enumerate(is_prime) if flag]


limit = int(input())
primes = sieve(limit)
print("count:", len(primes))
for start in range(0, len(primes), 8):
    chunk = primes[start:start + 8]
    print(" ".join(str(p).rjust(3) for p in chunk))
twins = []
for a, b in zip(primes, primes[1:]):
    if b - a == 2:
        twins.append((a, b))
print("twin pairs:", len(twins))
gaps = [b - a for a, b in zip(primes, primes[1:])]
max_gap = max(gaps)
idx = gaps.index(max_gap)
print(f"largest gap {max_gap} between {primes[idx]} and {primes[idx + 1]}")
