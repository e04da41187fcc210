from math import gcd


def reduce(num, den):
    if den < 0:
        num, den = -num, -den
    g = gcd(num, den)
    return num // g, den // g


def parse(tok):
    if "/" in tok:
        a, b = tok.split("/")
        return reduce(int(a), int(b))
    return int(tok), 1


def fmt(fr):
    num, den = fr
    if den == 1:
        return str(num)
    whole, rest = divmod(abs(num), den)
    sign = "-" if num < 0 else ""
    mixed = f" = {sign}{whole} {rest}/{den}" if whole else ""
    return f"{num}/{den}{mixed}"


count = int(input())
running = (0, 1)
for _ in range(count):
    left, op, right = input().split()
    a, b = parse(left)
    c, d = parse(right)
    if op == "+":
        res = reduce(a * d + c * b, b * d)
    elif op == "-":
        res = reduce(a * d - c * b, b * d)
    elif op == "*":
        res = reduce(a * c, b * d)
    else:
        res = reduce(a * d, b * c)
    running = reduce(running[0] * res[1] + res[0] * running[1], running[1] * res[1])
    print(f"{left} {op} {right} = {fmt(res)}  (~{res[0] / res[1]:.4f})")
print("sum of all results:", fmt(running))
