import sys
from bisect import bisect_right

records = {}
for line in sys.stdin:
    parts = line.split()
    if len(parts) < 2:
        continue
    name = parts[0]
    scores = [int(s) for s in parts[1:]]
    records[name] = scores


CUTOFFS = [60, 70, 80, 90]
LETTERS = "FDCBA"


def letter(avg):
    slot = bisect_right(CUTOFFS, avg)
    return LETTERS[slot]


summary = []
for name, scores in records.items():
    avg = sum(scores) / len(scores)
    summary.append((name, avg, max(scores), min(scores)))

summary.sort(key=lambda row: row[1], reverse=True)
print("{:<8}{:>8}{:>6}{:>6}{:>7}".format("name", "avg", "hi", "lo", "grade"))
print("-" * 35)
dist = {}
for name, avg, hi, lo in summary:
    g = letter(avg)
    dist[g] = dist.get(g, 0) + 1
    print("{:<8}{:>8.2f}{:>6}{:>6}{:>7}".format(name, avg, hi, lo, g))
print("-" * 35)
class_avg = sum(row[1] for row in summary) / len(summary)
print(f"class average: {class_avg:.3f}")
print("grade counts:", ", ".join(f"{g}={dist[g]}" for g in sorted(dist)))
