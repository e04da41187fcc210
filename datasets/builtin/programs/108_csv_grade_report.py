import sys


def parse_row(line):
    fields = []
    current = ""
    quoted = False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            fields.append(current)
            current = ""
        else:
            current += ch
    fields.append(current)
    return [f.strip() for f in fields]


lines = sys.stdin.read().splitlines()
header = parse_row(lines[0])
subjects = header[1:]
totals = [0] * len(subjects)
students = []
for line in lines[1:]:
    row = parse_row(line)
    name = row[0]
    marks = []
    for i, cell in enumerate(row[1:]):
        mark = int(cell) if cell else 0
        marks.append(mark)
        totals[i] += mark
    average = sum(marks) / len(marks)
    students.append((name, marks, average))

width = max(len(s[0]) for s in students) + 2
print("Name".ljust(width) + "".join(f"{s[:5]:>7}" for s in subjects) + "    avg")
for name, marks, average in sorted(students, key=lambda s: -s[2]):
    print(name.ljust(width) + "".join(f"{m:>7}" for m in marks) + f"{average:>7.1f}")
means = [t / len(students) for t in totals]
print("Mean".ljust(width) + "".join(f"{m:>7.1f}" for m in means))
hardest = subjects[means.index(min(means))]
print("hardest subject:", hardest)
