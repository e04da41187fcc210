import math

num, den = map(int, input().split("/"))
g = math.gcd(num, den)
num, den = num // g, den // g
print(f"{num}/{den}")
whole, rest = divmod(num, den)
print(f"{whole} {rest}/{den}" if rest else whole)
