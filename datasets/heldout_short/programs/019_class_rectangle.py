class Rectangle:
    def __init__(self, w, h):
        self.w = w
        self.h = h

    def area(self):
        return self.w * self.h

    def perimeter(self):
        return 2 * (self.w + self.h)


w, h = map(int, input().split())
r = Rectangle(w, h)
print(r.area())
print(r.perimeter())
