import math

deg = float(input())
rad = math.radians(deg)
print(round(rad, 4))
print(round(math.sin(rad), 4))
print(round(math.cos(rad), 4))
