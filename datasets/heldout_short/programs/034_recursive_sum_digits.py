def digital_root(n):
    if n < 10:
        return n
    return digital_root(sum(int(d) for d in str(n)))


print(digital_root(int(input())))
