from collections import deque

rows, cols = map(int, input().split())
grid = [input().strip() for _ in range(rows)]
start = goal = None
for r in range(rows):
    for c in range(cols):
        if grid[r][c] == "S":
            start = (r, c)
        elif grid[r][c] == "G":
            goal = (r, c)

dist = [[-1] * cols for _ in range(rows)]
prev = {}
dist[start[0]][start[1]] = 0
queue = deque([start])
while queue:
    r, c = queue.popleft()
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        nr, nc = r + dr, c + dc
        if 0 <= nr < rows and 0 <= nc < cols and grid[nr][nc] != "#":
            if dist[nr][nc] == -1:
                dist[nr][nc] = dist[r][c] + 1
                prev[(nr, nc)] = (r, c)
                queue.append((nr, nc))

steps = dist[goal[0]][goal[1]]
print("shortest path length:", steps)
canvas = [list(row) for row in grid]
node = prev.get(goal)
while node is not None and node != start:
    canvas[node[0]][node[1]] = "*"
    node = prev.get(node)
for row in canvas:
    print("".join(row))
reachable = sum(1 for r in range(rows) for c in range(cols) if dist[r][c] >= 0)
print("reachable cells:", reachable)
