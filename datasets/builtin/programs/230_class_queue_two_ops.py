class Queue:
    def __init__(self):
        self.items = []

    def put(self, x):
        self.items.append(x)

    def get(self):
        return self.items.pop(0)


q = Queue()
for x in input().split():
    q.put(int(x))
print(q.get())
print(q.items)
