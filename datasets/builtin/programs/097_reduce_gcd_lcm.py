from functools import reduce, partial
from math import gcd


def lcm(a, b):
    return a * b // gcd(a, b)


def scale(factor, value):
    return factor * value


for line in open(0):
    nums = [int(tok) for tok in line.split()]
    if not nums:
        continue
    g = reduce(gcd, nums)
    l = reduce(lcm, nums)
    product = reduce(lambda acc, x: acc * x, nums, 1)
    digits = reduce(lambda acc, x: acc * 10 + x % 10, nums, 0)
    triple = list(map(partial(scale, 3), nums))
    print(f"nums={nums}")
    print(f"  gcd={g} lcm={l} product={product}")
    print(f"  last-digit number={digits} tripled={triple}")
    if g > 1:
        reduced = [n // g for n in nums]
        print(f"  reduced by gcd: {reduced}")
    else:
        print("  already coprime")
