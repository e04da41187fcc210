class Box:
    def __init__(self, length, width, height):
        self.length = length
        self.width = width
        self.height = height

    def volume(self):
        return self.length * self.width * self.height

    def surface(self):
        l, w, h = self.length, self.width, self.height
        return 2 * (l * w + w * h + l * h)


b = Box(*map(int, input().split()))
print(b.volume())
print(b.surface())
