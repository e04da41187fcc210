class Shape:
    def area(self):
        return 0


class Square(Shape):
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side ** 2


shapes = [Shape(), Square(int(input()))]
print([s.area() for s in shapes])
