def total(*args):
    return sum(args)


print(total(*map(int, input().split())))
