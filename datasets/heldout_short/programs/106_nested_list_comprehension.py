n = int(input())
table = [[i * j for j in range(1, n + 1)] for i in range(1, n + 1)]
print(table)
print(sum(map(sum, table)))
