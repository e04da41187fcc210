n = int(input())
print(sum(i * i for i in range(2, n + 1, 2)))
