from fractions import Fraction


def determinant(m):
    n = len(m)
    a = [[Fraction(x) for x in row] for row in m]
    det = Fraction(1)
    for col in range(n):
        pivot = None
        for r in range(col, n):
            if a[r][col] != 0:
                pivot = r
                break
        if pivot is None:
            return Fraction(0)
        if pivot != col:
            a[col], a[pivot] = a[pivot], a[col]
            det = -det
        det *= a[col][col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            for c in range(col, n):
                a[r][c] -= factor * a[col][c]
    return det


def transpose(m):
    return [list(row) for row in zip(*m)]


blocks = open(0).read().strip().split("\n\n")
for index, block in enumerate(blocks, 1):
    matrix = [list(map(int, line.split())) for line in block.splitlines()]
    t = transpose(matrix)
    det = determinant(matrix)
    symmetric = matrix == t
    trace = sum(matrix[i][i] for i in range(len(matrix)))
    print(f"matrix {index}: det={det} trace={trace} symmetric={symmetric}")
    print("  transpose rows:", t)
