import sys


def divisors(n):
    small = []
    large = []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


nums = [int(tok) for tok in sys.stdin.read().split()]
kinds = {"perfect": [], "abundant": [], "deficient": []}
for n in nums:
    divs = divisors(n)
    proper_sum = sum(divs) - n
    if proper_sum == n:
        kind = "perfect"
    elif proper_sum > n:
        kind = "abundant"
    else:
        kind = "deficient"
    kinds[kind].append(n)
    prime_note = " (prime)" if len(divs) == 2 else ""
    print(f"{n:>5}: {len(divs):2d} divisors, proper sum {proper_sum:>5} -> {kind}{prime_note}")
for kind in ("perfect", "abundant", "deficient"):
    members = kinds[kind]
    print(f"{kind:>9}: {', '.join(map(str, members)) if members else '-'}")
