def read_matrix():
    r, c = map(int, input().split())
    rows = []
    for _ in range(r):
        rows.append([int(x) for x in input().split()])
    return rows


def multiply(a, b):
    n = len(a)
    m = len(b[0])
    inner = len(b)
    result = [[0] * m for _ in range(n)]
    for i in range(n):
        for j in range(m):
            acc = 0
            for k in range(inner):
                acc += a[i][k] * b[k][j]
            result[i][j] = acc
    return result


def show(name, mat):
    print(name + ":")
    width = max(len(str(v)) for row in mat for v in row)
    for row in mat:
        print("  " + " ".join(str(v).rjust(width) for v in row))


a = read_matrix()
b = read_matrix()
c = multiply(a, b)
show("A", a)
show("B", b)
show("A x B", c)
trace = 0
for i in range(min(len(c), len(c[0]))):
    trace += c[i][i]
print("trace of product:", trace)
