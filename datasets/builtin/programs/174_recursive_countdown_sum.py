def total(n):
    return 0 if n == 0 else n + total(n - 1)


print(total(int(input())))
