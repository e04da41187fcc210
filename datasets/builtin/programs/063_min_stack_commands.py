class MinStack:
    def __init__(self):
        self.items = []
        self.mins = []

    def push(self, value):
        self.items.append(value)
        if not self.mins or value <= self.mins[-1]:
            self.mins.append(value)

    def pop(self):
        value = self.items.pop()
        if value == self.mins[-1]:
            self.mins.pop()
        return value

    def minimum(self):
        return self.mins[-1] if self.mins else None


stack = MinStack()
errors = 0
popped_total = 0
for line in open(0):
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "push":
        for tok in cmd[1:]:
            stack.push(int(tok))
        print(f"push {' '.join(cmd[1:]):<10} size={len(stack.items)} min={stack.minimum()}")
    elif cmd[0] == "pop":
        if stack.items:
            value = stack.pop()
            popped_total += value
            print(f"pop -> {value:<7} size={len(stack.items)} min={stack.minimum()}")
        else:
            errors += 1
            print("pop on empty stack")
    elif cmd[0] == "min":
        print("current min:", stack.minimum())
print("final contents:", stack.items)
print("sum of popped:", popped_total, "errors:", errors)
