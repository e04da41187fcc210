class Color:
    def __init__(self, r, g, b):
        self.r, self.g, self.b = r, g, b

    @classmethod
    def from_hex(cls, text):
        text = text.lstrip("#")
        return cls(int(text[0:2], 16), int(text[2:4], 16), int(text[4:6], 16))

    def brightness(self):
        return (self.r + self.g + self.b) // 3


c = Color.from_hex(input().strip())
print(c.r, c.g, c.b)
print(c.brightness())
print("light" if c.brightness() > 127 else "dark")
