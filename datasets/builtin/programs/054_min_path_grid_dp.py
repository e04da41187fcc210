rows, cols = map(int, input().split())
cost = []
for _ in range(rows):
    cost.append(list(map(int, input().split())))

best = [[0] * cols for _ in range(rows)]
came = [[""] * cols for _ in range(rows)]
for r in range(rows):
    for c in range(cols):
        here = cost[r][c]
        if r == 0 and c == 0:
            best[r][c] = here
        elif r == 0:
            best[r][c] = best[r][c - 1] + here
            came[r][c] = "L"
        elif c == 0:
            best[r][c] = best[r - 1][c] + here
            came[r][c] = "U"
        else:
            if best[r - 1][c] <= best[r][c - 1]:
                best[r][c] = best[r - 1][c] + here
                came[r][c] = "U"
            else:
                best[r][c] = best[r][c - 1] + here
                came[r][c] = "L"

r, c = rows - 1, cols - 1
path = []
while (r, c) != (0, 0):
    path.append((r, c))
    if came[r][c] == "U":
        r -= 1
    else:
        c -= 1
path.append((0, 0))
path.reverse()
print("dp table:")
for row in best:
    print("  " + " ".join(f"{v:3d}" for v in row))
print("minimum cost:", best[-1][-1])
print("path:", " ".join(f"({pr},{pc})" for pr, pc in path))
print("cells on path:", [cost[pr][pc] for pr, pc in path])
