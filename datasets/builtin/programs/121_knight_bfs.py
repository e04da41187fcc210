from collections import deque

size = int(input())
start = input().strip()
targets = input().split()
blocked = set(input().split())


def to_cell(square):
    return ord(square[0]) - ord("a"), int(square[1:]) - 1


def to_name(cell):
    return chr(cell[0] + ord("a")) + str(cell[1] + 1)


moves = [(1, 2), (2, 1), (-1, 2), (-2, 1), (1, -2), (2, -1), (-1, -2), (-2, -1)]
origin = to_cell(start)
dist = {origin: 0}
parent = {origin: None}
queue = deque([origin])
while queue:
    x, y = queue.popleft()
    for dx, dy in moves:
        nx, ny = x + dx, y + dy
        if not (0 <= nx < size and 0 <= ny < size):
            continue
        if (nx, ny) in dist or to_name((nx, ny)) in blocked:
            continue
        dist[(nx, ny)] = dist[(x, y)] + 1
        parent[(nx, ny)] = (x, y)
        queue.append((nx, ny))

for target in targets:
    cell = to_cell(target)
    if cell not in dist:
        print(f"{start} -> {target}: unreachable")
        continue
    route = []
    while cell is not None:
        route.append(to_name(cell))
        cell = parent[cell]
    print(f"{start} -> {target}: {len(route) - 1} moves ({' '.join(reversed(route))})")
print("reachable squares:", len(dist), "of", size * size - len(blocked))
print("max distance:", max(dist.values()))
