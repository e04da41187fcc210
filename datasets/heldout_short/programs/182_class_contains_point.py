class Area:
    def __init__(self, x1, y1, x2, y2):
        self.x1, self.y1, self.x2, self.y2 = x1, y1, x2, y2

    def __contains__(self, point):
        x, y = point
        return self.x1 <= x <= self.x2 and self.y1 <= y <= self.y2


area = Area(*map(int, input().split()))
points = [tuple(map(int, p.split(","))) for p in input().split()]
inside = [p for p in points if p in area]
print(len(inside))
print(inside)
