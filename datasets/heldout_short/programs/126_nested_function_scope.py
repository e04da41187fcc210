def outer(n):
    total = 0

    def add(k):
        nonlocal total
        total += k

    for i in range(n):
        add(i)
    return total


print(outer(int(input())))
