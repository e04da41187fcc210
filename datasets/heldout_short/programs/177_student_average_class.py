class Student:
    def __init__(self, name):
        self.name = name
        self.marks = []

    def add(self, mark):
        self.marks.append(mark)

    def average(self):
        return sum(self.marks) / len(self.marks)


parts = input().split()
s = Student(parts[0])
for m in parts[1:]:
    s.add(int(m))
print(f"{s.name}: {s.average():.1f}")
