import statistics

days = []
while True:
    try:
        line = input()
    except EOFError:
        break
    day, *readings = line.split()
    temps = [float(t) for t in readings]
    days.append((day, temps))

print(f"{'day':<4}{'min':>7}{'max':>7}{'mean':>8}{'range':>7}  trend")
all_temps = []
previous_mean = None
for day, temps in days:
    lo, hi = min(temps), max(temps)
    mean = sum(temps) / len(temps)
    all_temps.extend(temps)
    if previous_mean is None:
        trend = "  ."
    elif mean > previous_mean:
        trend = f" +{mean - previous_mean:.1f}"
    else:
        trend = f" -{previous_mean - mean:.1f}"
    previous_mean = mean
    print(f"{day:<4}{lo:>7.1f}{hi:>7.1f}{mean:>8.2f}{hi - lo:>7.1f} {trend}")

fahrenheit = [t * 9 / 5 + 32 for t in all_temps]
print(f"overall mean: {statistics.mean(all_temps):.2f} C / {statistics.mean(fahrenheit):.2f} F")
print(f"median: {statistics.median(all_temps):.1f}  stdev: {statistics.pstdev(all_temps):.3f}")
freezing = sum(1 for t in all_temps if t <= 0)
print(f"readings at or below zero: {freezing}/{len(all_temps)} ({freezing / len(all_temps):.0%})")
hottest_day = max(days, key=lambda d: max(d[1]))[0]
print(f"hottest day: {hottest_day:>5}|{hottest_day:^7}|{hottest_day:<5}|")
