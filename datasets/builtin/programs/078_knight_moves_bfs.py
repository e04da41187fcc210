from collections import deque

MOVES = [(1, 2), (2, 1), (2, -1), (1, -2), (-1, -2), (-2, -1), (-2, 1), (-1, 2)]


def parse(square):
    return ord(square[0]) - ord("a"), int(square[1]) - 1


def knight_distances(start, size):
    dist = [[-1] * size for _ in range(size)]
    sx, sy = start
    dist[sy][sx] = 0
    queue = deque([start])
    while queue:
        x, y = queue.popleft()
        for dx, dy in MOVES:
            nx, ny = x + dx, y + dy
            if 0 <= nx < size and 0 <= ny < size and dist[ny][nx] < 0:
                dist[ny][nx] = dist[y][x] + 1
                queue.append((nx, ny))
    return dist


size = int(input())
start_sq = input().strip()
targets = input().split()
dist = knight_distances(parse(start_sq), size)
for y in range(size - 1, -1, -1):
    print(f"{y + 1} " + " ".join(str(d) for d in dist[y]))
print("  " + " ".join(chr(ord("a") + x) for x in range(size)))
for sq in targets:
    x, y = parse(sq)
    print(f"{start_sq} -> {sq}: {dist[y][x]} moves")
far = max(max(row) for row in dist)
print("farthest squares need", far, "moves")
