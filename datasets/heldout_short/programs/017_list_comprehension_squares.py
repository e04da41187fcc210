n = int(input())
squares = [i * i for i in range(1, n + 1)]
print(squares)
print(sum(squares))
