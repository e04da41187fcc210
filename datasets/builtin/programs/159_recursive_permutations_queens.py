import sys


def permutations(items):
    if len(items) <= 1:
        yield list(items)
        return
    for i, head in enumerate(items):
        rest = items[:i] + items[i + 1:]
        for tail in permutations(rest):
            yield [head] + tail


def subsets(items, index=0, current=None):
    if current is None:
        current = []
    if index == len(items):
        yield tuple(current)
        return
    yield from subsets(items, index + 1, current)
    current.append(items[index])
    yield from subsets(items, index + 1, current)
    current.pop()


def queens(n, row=0, cols=()):
    if row == n:
        yield cols
        return
    for c in range(n):
        if all(c != pc and abs(c - pc) != row - pr for pr, pc in enumerate(cols)):
            yield from queens(n, row + 1, cols + (c,))


letters = sys.stdin.readline().split()
size = int(sys.stdin.readline())
perms = ["".join(p) for p in permutations(letters)]
print(len(perms), "permutations:", " ".join(perms[:8]), "...")
distinct = sorted(set(perms))
print("distinct:", len(distinct))
subs = list(subsets(letters[:4]))
print(len(subs), "subsets, e.g.", subs[:5])
solutions = list(queens(size))
print(f"{size}-queens solutions: {len(solutions)}")
first = solutions[0]
for r in range(size):
    print(" ".join("Q" if first[r] == c else "." for c in range(size)))
