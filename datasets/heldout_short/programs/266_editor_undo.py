class Editor:
    def __init__(self):
        self.text = ""
        self.history = []

    def write(self, s):
        self.history.append(self.text)
        self.text += s

    def undo(self):
        if self.history:
            self.text = self.history.pop()


ed = Editor()
for cmd in input().split():
    if cmd == "<":
        ed.undo()
    else:
        ed.write(cmd)
print(ed.text)
print(len(ed.history))
