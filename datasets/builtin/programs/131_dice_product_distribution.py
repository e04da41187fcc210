from itertools import product
from collections import Counter

specs = input().split()
dice = []
for spec in specs:
    count, sides = spec.lower().split("d")
    dice.extend([int(sides)] * int(count or 1))

faces = [range(1, s + 1) for s in dice]
totals = Counter()
outcomes = 0
doubles = 0
for roll in product(*faces):
    totals[sum(roll)] += 1
    outcomes += 1
    if len(set(roll)) < len(roll):
        doubles += 1

print(f"dice {dice}: {outcomes} outcomes")
peak = max(totals.values())
for total in sorted(totals):
    ways = totals[total]
    bar = "#" * round(ways * 30 / peak)
    print(f"{total:>3} {ways:>4} {ways / outcomes:6.2%} {bar}")
expected = sum(t * w for t, w in totals.items()) / outcomes
print(f"expected total: {expected:.2f}")
print(f"some face repeated: {doubles}/{outcomes}")
target = int(input())
at_least = sum(w for t, w in totals.items() if t >= target)
print(f"P(total >= {target}) = {at_least}/{outcomes} = {at_least / outcomes:.4f}")
