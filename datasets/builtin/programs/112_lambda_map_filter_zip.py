import sys

lines = sys.stdin.read().splitlines()
names = lines[0].split()
heights = list(map(int, lines[1].split()))
weights = list(map(float, lines[2].split()))

bmi = lambda h, w: w / (h / 100) ** 2
people = list(zip(names, heights, weights))
scores = list(map(lambda p: (p[0], round(bmi(p[1], p[2]), 1)), people))
for name, value in scores:
    category = "under" if value < 18.5 else "normal" if value < 25 else "over"
    print(f"{name:<7}{value:>6} {category}")

tall = list(filter(lambda p: p[1] >= 175, people))
print("tall:", [p[0] for p in tall])
initials = "".join(map(lambda n: n[0].upper(), names))
print("initials:", initials)
pairs = list(zip(names, names[1:]))
diffs = [abs(a - b) for a, b in zip(heights, heights[1:])]
for (a, b), d in zip(pairs, diffs):
    print(f"  {a}->{b}: {d} cm")
ranked = sorted(enumerate(weights), key=lambda t: t[1], reverse=True)
print("heaviest first:", [names[i] for i, _ in ranked])
total = sum(map(lambda w: w * 2.2046, weights))
print(f"total pounds: {total:.1f}")
print("any over 90kg:", any(map(lambda w: w > 90, weights)))
