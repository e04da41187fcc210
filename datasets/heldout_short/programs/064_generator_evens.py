def evens(limit):
    n = 0
    while n < limit:
        yield n
        n += 2


print(list(evens(int(input()))))
