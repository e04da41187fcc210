import sys


def read_matrix(tokens, pos):
    r, c = int(tokens[pos]), int(tokens[pos + 1])
    pos += 2
    mat = []
    for _ in range(r):
        mat.append([int(x) for x in tokens[pos:pos + c]])
        pos += c
    return mat, pos


def multiply(a, b):
    if len(a[0]) != len(b):
        raise ValueError(f"shape mismatch {len(a)}x{len(a[0])} * {len(b)}x{len(b[0])}")
    result = [[0] * len(b[0]) for _ in a]
    for i, row in enumerate(a):
        for j in range(len(b[0])):
            acc = 0
            for k, v in enumerate(row):
                acc += v * b[k][j]
            result[i][j] = acc
    return result


def power(m, e):
    result = [[int(i == j) for j in range(len(m))] for i in range(len(m))]
    while e:
        if e & 1:
            result = multiply(result, m)
        m = multiply(m, m)
        e >>= 1
    return result


def show(name, m):
    print(name + ":")
    for row in m:
        print("  " + " ".join(f"{v:>5}" for v in row))


tokens = sys.stdin.read().split()
a, pos = read_matrix(tokens, 0)
b, pos = read_matrix(tokens, pos)
show("A x B", multiply(a, b))
try:
    multiply(a, a)
except ValueError as err:
    print("error:", err)
fibm = [[1, 1], [1, 0]]
show("F^10", power(fibm, 10))
