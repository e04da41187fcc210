import math


class Vector:
    dims = 2

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __add__(self, other):
        return Vector(self.x + other.x, self.y + other.y)

    def __sub__(self, other):
        return Vector(self.x - other.x, self.y - other.y)

    def __mul__(self, k):
        return Vector(self.x * k, self.y * k)

    __rmul__ = __mul__

    def dot(self, other):
        return self.x * other.x + self.y * other.y

    def cross(self, other):
        return self.x * other.y - self.y * other.x

    def __abs__(self):
        return math.hypot(self.x, self.y)

    def __eq__(self, other):
        return (self.x, self.y) == (other.x, other.y)

    def __repr__(self):
        return f"Vector({self.x}, {self.y})"


points = []
for line in open(0):
    x, y = map(int, line.split())
    points.append(Vector(x, y))

perimeter = 0.0
area2 = 0
for a, b in zip(points, points[1:] + points[:1]):
    perimeter += abs(b - a)
    area2 += a.cross(b)
print("polygon:", points)
print(f"perimeter: {perimeter:.3f}  area: {abs(area2) / 2}")
centroid = Vector(sum(p.x for p in points) / len(points), sum(p.y for p in points) / len(points))
print("vertex mean:", centroid)
for a, b, c in zip(points, points[1:] + points[:1], points[2:] + points[:2]):
    turn = (b - a).cross(c - b)
    kind = "left" if turn > 0 else "right" if turn < 0 else "straight"
    angle = math.degrees(math.acos((b - a).dot(c - b) / (abs(b - a) * abs(c - b))))
    print(f"at {b}: {kind:<8} turn {angle:6.1f} deg")
print("2*v0 == v0+v0:", 2 * points[0] == points[0] + points[0])
