class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __str__(self):
        return f"Point({self.x}, {self.y})"

    def norm(self):
        return (self.x ** 2 + self.y ** 2) ** 0.5


x, y = map(int, input().split())
p = Point(x, y)
print(p)
print(p.norm())
