import math

r, h = map(float, input().split())
print(f"volume {math.pi * r * r * h:.2f}")
print(f"side {2 * math.pi * r * h:.2f}")
print(f"total {2 * math.pi * r * (r + h):.2f}")
