from dataclasses import dataclass, field, asdict


@dataclass(order=True)
class Runner:
    sort_key: tuple = field(init=False, repr=False)
    name: str
    country: str
    minutes: int
    seconds: int
    penalties: int = 0

    def __post_init__(self):
        self.sort_key = (self.total_seconds(), self.name)

    def total_seconds(self):
        return self.minutes * 60 + self.seconds + self.penalties * 30


runners = []
for line in open(0):
    name, country, time_text, *rest = line.split()
    mins, secs = map(int, time_text.split(":"))
    pen = int(rest[0]) if rest else 0
    runners.append(Runner(name, country, mins, secs, pen))

runners.sort()
leader = runners[0].total_seconds()
for place, r in enumerate(runners, 1):
    gap = r.total_seconds() - leader
    total = r.total_seconds()
    gap_text = "-" if gap == 0 else f"+{gap // 60}:{gap % 60:02d}"
    print(f"{place}. {r.name:<10} {r.country} {total // 60}:{total % 60:02d} {gap_text:>6}")

print(asdict(runners[-1]))
best_by_country = {}
for r in runners:
    if r.country not in best_by_country:
        best_by_country[r.country] = r.name
for country in sorted(best_by_country):
    print(f"best {country}: {best_by_country[country]}")
print("ordered:", all(a <= b for a, b in zip(runners, runners[1:])))
print("penalised:", [r.name for r in runners if r.penalties])
