from collections import namedtuple

Point = namedtuple("Point", "x y")
pts = [Point(*map(int, p.split(","))) for p in input().split()]
far = max(pts, key=lambda p: abs(p.x) + abs(p.y))
print(far)
print(far.x * far.y)
