import sys


def best_split(weights):
    total = sum(weights)
    half = total // 2
    reachable = [False] * (half + 1)
    reachable[0] = True
    choice = [-1] * (half + 1)
    for idx, w in enumerate(weights):
        for s in range(half, w - 1, -1):
            if not reachable[s] and reachable[s - w]:
                reachable[s] = True
                choice[s] = idx
    best = half
    while not reachable[best]:
        best -= 1
    group = []
    s = best
    while s > 0:
        idx = choice[s]
        group.append(weights[idx])
        s -= weights[idx]
    return best, total - best, sorted(group)


for case_no, line in enumerate(sys.stdin, 1):
    weights = list(map(int, line.split()))
    if not weights:
        continue
    left, right, group = best_split(weights)
    other = list(weights)
    for g in group:
        other.remove(g)
    print(f"case {case_no}: {weights}")
    print(f"   side A {group} = {left}")
    print(f"   side B {sorted(other)} = {right}, difference {right - left}")
