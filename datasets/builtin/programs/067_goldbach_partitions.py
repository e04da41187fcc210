def build_sieve(n):
    flags = bytearray([1]) * (n + 1)
    flags[0] = flags[1] = 0
    i = 2
    while i * i <= n:
        if flags[i]:
            flags[i * i::i] = bytearray(len(flags[i * i::i]))
        i += 1
    return flags


evens = [int(x) for x in input().split()]
limit = max(evens)
is_prime = build_sieve(limit)
most = (0, 0)
for n in evens:
    pairs = []
    for p in range(2, n // 2 + 1):
        q = n - p
        if is_prime[p] and is_prime[q]:
            pairs.append((p, q))
    if len(pairs) > most[0]:
        most = (len(pairs), n)
    shown = ", ".join(f"{p}+{q}" for p, q in pairs[:4])
    more = f" (+{len(pairs) - 4} more)" if len(pairs) > 4 else ""
    print(f"{n:4d} = {shown}{more}")
print(f"most partitions: {most[1]} with {most[0]}")
prime_count = sum(is_prime)
print(f"primes up to {limit}: {prime_count}")
