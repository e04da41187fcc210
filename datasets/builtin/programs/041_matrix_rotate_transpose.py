import sys


def transpose(mat):
    return [list(col) for col in zip(*mat)]


def rotate_clockwise(mat):
    rotated = transpose(mat)
    for row in rotated:
        row.reverse()
    return rotated


def show(title, mat):
    print(title)
    for row in mat:
        print("   " + " ".join(f"{v:2d}" for v in row))


lines = sys.stdin.read().strip().splitlines()
turns = int(lines[0])
matrix = [[int(x) for x in line.split()] for line in lines[1:]]
show("original", matrix)
show("transpose", transpose(matrix))
current = matrix
for t in range(turns):
    current = rotate_clockwise(current)
show(f"rotated {turns} x 90 degrees", current)
print("symmetric:", matrix == transpose(matrix))

rows, cols = len(matrix), len(matrix[0])
pre = [[0] * (cols + 1) for _ in range(rows + 1)]
for r in range(rows):
    for c in range(cols):
        pre[r + 1][c + 1] = matrix[r][c] + pre[r][c + 1] + pre[r + 1][c] - pre[r][c]
best = None
for r in range(rows - 1):
    for c in range(cols - 1):
        block = pre[r + 2][c + 2] - pre[r][c + 2] - pre[r + 2][c] + pre[r][c]
        if best is None or block > best[0]:
            best = (block, r, c)
print("total via prefix table:", pre[rows][cols])
print(f"best 2x2 block sum {best[0]} at row {best[1]}, col {best[2]}")
