import sys


class DisjointSet:
    def __init__(self, items):
        self.parent = {x: x for x in items}
        self.size = {x: 1 for x in items}
        self.unions = 0

    def find(self, x):
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            nxt = self.parent[x]
            self.parent[x] = root
            x = nxt
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]
        self.unions += 1
        return True


people = sys.stdin.readline().split()
ds = DisjointSet(people)
redundant = []
for line in sys.stdin:
    a, b = line.split()
    if not ds.union(a, b):
        redundant.append(f"{a}-{b}")

groups = {}
for p in people:
    groups.setdefault(ds.find(p), []).append(p)
ordered = sorted(groups.values(), key=lambda g: (-len(g), g))
for idx, members in enumerate(ordered, 1):
    print(f"circle {idx}: {' '.join(sorted(members))}")
print("unions:", ds.unions, "redundant links:", redundant)
print("components:", len(groups), "largest:", len(ordered[0]))
