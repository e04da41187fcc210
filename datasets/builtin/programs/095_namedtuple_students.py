from collections import namedtuple
import sys

Student = namedtuple("Student", ["name", "year", "major", "gpa", "credits"])

roster = []
for row in sys.stdin.read().strip().split("\n"):
    name, year, major, gpa, credits = [field.strip() for field in row.split("|")]
    roster.append(Student(name, int(year), major, float(gpa), int(credits)))

print(roster[0])
by_major = sorted(roster, key=lambda s: (s.major, -s.gpa, s.name))
current = None
for s in by_major:
    if s.major != current:
        current = s.major
        print(f"[{current}]")
    print(f"  {s.name:<8} y{s.year} gpa={s.gpa:.2f} cr={s.credits}")

honors = [s._replace(name=s.name.upper()) for s in roster if s.gpa >= 3.5]
print("honors:", ", ".join(s.name for s in honors))
total_credits = 0
weighted = 0.0
for s in roster:
    total_credits += s.credits
    weighted += s.gpa * s.credits
print(f"weighted gpa: {weighted / total_credits:.3f}")
senior = max(roster, key=lambda s: (s.year, s.credits))
print("most senior:", senior._asdict()["name"], senior.year)
