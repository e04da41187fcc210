rows, cols = map(int, input().split())
start = int(input())
grid = [[0] * cols for _ in range(rows)]
top, bottom = 0, rows - 1
left, right = 0, cols - 1
value = start
while top <= bottom and left <= right:
    for c in range(left, right + 1):
        grid[top][c] = value
        value += 1
    top += 1
    for r in range(top, bottom + 1):
        grid[r][right] = value
        value += 1
    right -= 1
    if top <= bottom:
        for c in range(right, left - 1, -1):
            grid[bottom][c] = value
            value += 1
        bottom -= 1
    if left <= right:
        for r in range(bottom, top - 1, -1):
            grid[r][left] = value
            value += 1
        left += 1

width = len(str(value - 1))
for row in grid:
    print(" ".join(str(v).rjust(width) for v in row))
diag = [grid[i][i] for i in range(min(rows, cols))]
print("main diagonal:", diag)
row_sums = [sum(row) for row in grid]
print("row sums:", row_sums)
col_sums = [sum(grid[r][c] for r in range(rows)) for c in range(cols)]
print("column sums:", col_sums)
