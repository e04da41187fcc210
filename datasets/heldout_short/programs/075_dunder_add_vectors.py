class Vec:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __add__(self, other):
        return Vec(self.x + other.x, self.y + other.y)

    def __repr__(self):
        return f"Vec({self.x}, {self.y})"


a = Vec(*map(int, input().split()))
b = Vec(*map(int, input().split()))
print(a + b)
