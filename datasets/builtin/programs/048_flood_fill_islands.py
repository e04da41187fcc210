import sys

sys.setrecursionlimit(5000)
grid = [list(line.rstrip("\n")) for line in sys.stdin if line.strip()]
rows = len(grid)
cols = len(grid[0])
label = [[0] * cols for _ in range(rows)]


def fill(r, c, mark):
    if r < 0 or r >= rows or c < 0 or c >= cols:
        return 0
    if grid[r][c] != "#" or label[r][c]:
        return 0
    label[r][c] = mark
    size = 1
    size += fill(r + 1, c, mark)
    size += fill(r - 1, c, mark)
    size += fill(r, c + 1, mark)
    size += fill(r, c - 1, mark)
    return size


sizes = []
mark = 0
for r in range(rows):
    for c in range(cols):
        if grid[r][c] == "#" and not label[r][c]:
            mark += 1
            sizes.append(fill(r, c, mark))

print("islands:", mark)
for r in range(rows):
    print("".join(chr(ord("a") + label[r][c] - 1) if label[r][c] else "~" for c in range(cols)))
for i, s in enumerate(sizes):
    print(f"island {chr(ord('a') + i)}: {s} cells")
print("largest:", max(sizes), "smallest:", min(sizes))
