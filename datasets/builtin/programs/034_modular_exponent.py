def power_mod(base, exp, mod):
    result = 1
    base %= mod
    squarings = 0
    while exp > 0:
        if exp & 1:
            result = result * base % mod
        base = base * base % mod
        squarings += 1
        exp >>= 1
    return result, squarings


def mod_inverse(a, m):
    old_r, r = a, m
    old_s, s = 1, 0
    while r != 0:
        q = old_r // r
        old_r, r = r, old_r - q * r
        old_s, s = s, old_s - q * s
    if old_r != 1:
        return None
    return old_s % m


import sys

mod = int(sys.stdin.readline())
for line in sys.stdin:
    base, exp = map(int, line.split())
    value, steps = power_mod(base, exp, mod)
    builtin = pow(base, exp, mod)
    inv = mod_inverse(base, mod)
    inv_text = str(inv) if inv is not None else "none"
    match = "ok" if value == builtin else "BAD"
    print(f"{base}^{exp} mod {mod} = {value} [{match}] squarings={steps} inverse={inv_text}")
