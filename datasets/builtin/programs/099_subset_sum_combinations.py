from itertools import combinations

data = input().split()
target = int(data[0])
coins = list(map(int, data[1:]))

found = []
for size in range(1, len(coins) + 1):
    for combo in combinations(coins, size):
        if sum(combo) == target:
            found.append(combo)
    if found:
        break

if found:
    print(f"smallest subsets summing to {target} (size {len(found[0])}):")
    for combo in found:
        print("  " + " + ".join(map(str, combo)))
else:
    print("no subset reaches", target)

all_count = 0
closest = None
for size in range(len(coins) + 1):
    for combo in combinations(range(len(coins)), size):
        total = sum(coins[i] for i in combo)
        if total == target:
            all_count += 1
        gap = abs(total - target)
        if closest is None or gap < closest[0]:
            closest = (gap, total)
print("total matching subsets:", all_count)
print("pairs:", sum(1 for a, b in combinations(coins, 2) if a + b == target))
print("closest sum:", closest[1])
