def paths(r, c):
    if r == 1 or c == 1:
        return 1
    return paths(r - 1, c) + paths(r, c - 1)


r, c = map(int, input().split())
print(paths(r, c))
