import sys
sys.setrecursionlimit(10000)

lines = [line.rstrip("\n") for line in sys.stdin if line.strip()]
grid = [list(line) for line in lines]
height = len(grid)
width = len(grid[0])
label = 0
sizes = []


def fill(r, c, mark):
    if r < 0 or r >= height or c < 0 or c >= width:
        return 0
    if grid[r][c] != "#":
        return 0
    grid[r][c] = mark
    area = 1
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        area += fill(r + dr, c + dc, mark)
    return area


for r in range(height):
    for c in range(width):
        if grid[r][c] == "#":
            mark = chr(ord("a") + label)
            label += 1
            size = fill(r, c, mark)
            sizes.append((mark, size))

for row in grid:
    print("".join(row))
print("islands:", label)
for mark, size in sorted(sizes, key=lambda p: (-p[1], p[0])):
    print(f"  {mark}: {size}")
largest = max(sizes, key=lambda p: p[1]) if sizes else None
print("largest:", largest)
