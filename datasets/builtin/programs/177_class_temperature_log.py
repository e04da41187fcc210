class Log:
    def __init__(self):
        self.values = []

    def add(self, v):
        self.values.append(v)

    def spread(self):
        return max(self.values) - min(self.values)


log = Log()
for v in map(int, input().split()):
    log.add(v)
print(log.spread(), len(log.values))
