from itertools import groupby
from operator import itemgetter

records = []
header = input().split(",")
while True:
    try:
        line = input().strip()
    except EOFError:
        break
    if not line:
        continue
    region, rep, amount = line.split(",")
    records.append((region, rep, int(amount)))

print("columns:", header)
records.sort(key=itemgetter(0, 1))
grand = 0
for region, group in groupby(records, key=itemgetter(0)):
    rows = list(group)
    region_total = sum(r[2] for r in rows)
    grand += region_total
    print(f"{region}: {region_total}")
    for rep, sub in groupby(rows, key=itemgetter(1)):
        amounts = [r[2] for r in sub]
        print(f"   {rep:<6} {len(amounts)} sales  {sum(amounts):>6}")
print("grand total:", grand)

streaks = [(k, len(list(g))) for k, g in groupby(r[2] > 100 for r in records)]
longest_big = max((n for k, n in streaks if k), default=0)
print("longest run of big sales:", longest_big)
