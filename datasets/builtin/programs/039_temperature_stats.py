import math

readings = {}
order = []
while True:
    try:
        line = input()
    except EOFError:
        break
    city, *temps = line.split()
    readings[city] = [float(t) for t in temps]
    order.append(city)


def stats(values):
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    ordered = sorted(values)
    if n % 2:
        median = ordered[n // 2]
    else:
        median = (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return mean, median, math.sqrt(var)


print(f"{'city':<10}{'mean':>8}{'median':>8}{'stdev':>8}{'F':>8}")
means = []
for city in order:
    mean, median, sd = stats(readings[city])
    fahrenheit = mean * 9 / 5 + 32
    means.append((mean, city))
    print(f"{city:<10}{mean:>8.2f}{median:>8.1f}{sd:>8.3f}{fahrenheit:>8.1f}")
means.sort(reverse=True)
print("warmest:", means[0][1], round(means[0][0], 1))
print("coldest:", means[-1][1], round(means[-1][0], 1))
spread = means[0][0] - means[-1][0]
print("spread:", round(spread, 2))
