rows, cols = map(int, input().split())
values = list(map(int, input().split()))

grid = [[0] * cols for _ in range(rows)]
top, bottom, left, right = 0, rows - 1, 0, cols - 1
k = 0
while top <= bottom and left <= right:
    for c in range(left, right + 1):
        grid[top][c] = values[k % len(values)]
        k += 1
    top += 1
    for r in range(top, bottom + 1):
        grid[r][right] = values[k % len(values)]
        k += 1
    right -= 1
    if top <= bottom:
        for c in range(right, left - 1, -1):
            grid[bottom][c] = values[k % len(values)]
            k += 1
        bottom -= 1
    if left <= right:
        for r in range(bottom, top - 1, -1):
            grid[r][left] = values[k % len(values)]
            k += 1
        left += 1

for row in grid:
    print(" ".join(f"{v:3d}" for v in row))
row_sums = [sum(row) for row in grid]
col_sums = [sum(col) for col in zip(*grid)]
print("row sums:", row_sums)
print("col sums:", col_sums)
diag = sum(grid[i][i] for i in range(min(rows, cols)))
print("diagonal:", diag, "cells filled:", k)
