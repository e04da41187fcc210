class Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)

    def pop(self):
        return self.items.pop()

    def peek(self):
        return self.items[-1] if self.items else None


s = Stack()
for x in map(int, input().split()):
    s.push(x)
s.pop()
print(s.peek(), len(s.items))
