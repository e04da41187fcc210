import sys

rows = [list(map(int, line.split())) for line in sys.stdin if line.strip()]
h, w = len(rows), len(rows[0])
INF = float("inf")
cost = [[INF] * w for _ in range(h)]
came = [[None] * w for _ in range(h)]
cost[0][0] = rows[0][0]
for r in range(h):
    for c in range(w):
        if r == 0 and c == 0:
            continue
        up = cost[r - 1][c] if r > 0 else INF
        left = cost[r][c - 1] if c > 0 else INF
        if up <= left:
            cost[r][c] = up + rows[r][c]
            came[r][c] = "D"
        else:
            cost[r][c] = left + rows[r][c]
            came[r][c] = "R"

path = []
r, c = h - 1, w - 1
while (r, c) != (0, 0):
    step = came[r][c]
    path.append(step)
    if step == "D":
        r -= 1
    else:
        c -= 1
path.reverse()

print("cost table:")
for line in cost:
    print("  " + " ".join(f"{v:>3}" for v in line))
print("min path sum:", cost[-1][-1])
print("moves:", "".join(path))
r = c = 0
visited = [rows[0][0]]
for step in path:
    r, c = (r + 1, c) if step == "D" else (r, c + 1)
    visited.append(rows[r][c])
print("cells:", " + ".join(map(str, visited)), "=", sum(visited))
