rows = [list(map(int, input().split())) for _ in range(3)]
print(sum(rows[i][i] for i in range(3)))
print(sum(rows[i][2 - i] for i in range(3)))
