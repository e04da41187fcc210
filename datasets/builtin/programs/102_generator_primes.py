import sys
from itertools import islice, takewhile


def primes():
    found = []
    candidate = 2
    while True:
        is_prime = True
        for p in found:
            if p * p > candidate:
                break
            if candidate % p == 0:
                is_prime = False
                break
        if is_prime:
            found.append(candidate)
            yield candidate
        candidate += 1


def twin_pairs(limit):
    prev = None
    for p in takewhile(lambda x: x <= limit, primes()):
        if prev is not None and p - prev == 2:
            yield prev, p
        prev = p


def factorize(n):
    for p in primes():
        if p * p > n:
            break
        while n % p == 0:
            yield p
            n //= p
    if n > 1:
        yield n


count, limit, *targets = map(int, sys.stdin.read().split())
print("first primes:", list(islice(primes(), count)))
print("twins:", list(twin_pairs(limit)))
for t in targets:
    factors = list(factorize(t))
    print(f"{t} = {' * '.join(map(str, factors))}")
print("sum of primes below limit:", sum(takewhile(lambda x: x < limit, primes())))
