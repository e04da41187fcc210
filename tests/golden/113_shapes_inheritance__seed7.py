import math

class Shape:
    sides = 0
    created = 0

    def __init__(self, label):
        self.label = label
        print('__DBG_0__', repr(label) if isinstance(label, (int, float, str, bool, type(None))) else type(label).__name__)
        Shape.created += 1

    def area(self):
        raise NotImplementedError

    def __str__(self):
        return f'{self.__class__.__name__}({self.label}) area={self.area():.2f} perim={self.perimeter():.2f}'

class Rectangle(Shape):
    sides = 4

    def __init__(self, label, w, h):
        super().__init__(label)
        self.w, self.h = (w, h)
        print('__DBG_1__', repr(self) if isinstance(self, (int, float, str, bool, type(None))) else type(self).__name__, repr(label) if isinstance(label, (int, float, str, bool, type(None))) else type(label).__name__, repr(h) if isinstance(h, (int, float, str, bool, type(None))) else type(h).__name__)

    def area(self):
        return self.w * self.h

    def perimeter(self):
        return 2 * (self.w + self.h)

class Square(Rectangle):

    def __init__(self, label, side):
        super().__init__(label, side, side)

class Circle(Shape):

    def __init__(self, label, r):
        super().__init__(label)
        self.r = r

    def area(self):
        return math.pi * self.r ** 2

    def perimeter(self):
        return 2 * math.pi * self.r
factories = {'rect': Rectangle, 'square': Square, 'circle': Circle}
print('__DBG_2__', repr(factories) if isinstance(factories, (int, float, str, bool, type(None))) else type(factories).__name__)
shapes = []
print('__DBG_3__', repr(factories) if isinstance(factories, (int, float, str, bool, type(None))) else type(factories).__name__)
for line in open(0):
    kind, label, *dims = line.split()
    print('__DBG_4__', repr(label) if isinstance(label, (int, float, str, bool, type(None))) else type(label).__name__)
    shapes.append(factories[kind](label, *map(float, dims)))
for s in sorted(shapes, key=lambda s: s.area()):
    print(s)
print('created:', Shape.created, 'total sides:', sum((s.sides for s in shapes)))
print('squares are rects:', all((isinstance(s, Rectangle) for s in shapes if type(s) is Square)))
