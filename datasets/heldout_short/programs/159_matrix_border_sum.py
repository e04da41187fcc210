n = int(input())
grid = [list(map(int, input().split())) for _ in range(n)]
total = 0
for i in range(n):
    for j in range(n):
        if i == 0 or j == 0 or i == n - 1 or j == n - 1:
            total += grid[i][j]
print(total)
