import math

x = float(input())
print(math.floor(x), math.ceil(x))
print(math.trunc(x))
print(round(x))
