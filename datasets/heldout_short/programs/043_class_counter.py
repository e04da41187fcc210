class Counter:
    def __init__(self):
        self.value = 0

    def tick(self, step=1):
        self.value += step
        return self


n = int(input())
c = Counter()
for i in range(n):
    c.tick(i)
print(c.value)
