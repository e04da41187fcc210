def squares(n):
    for i in range(n):
        yield i * i


print(sum(squares(int(input()))))
