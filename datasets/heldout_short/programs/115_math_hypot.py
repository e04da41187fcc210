import math

a, b = map(int, input().split())
print(math.hypot(a, b))
print(math.gcd(a, b))
