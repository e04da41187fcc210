from fractions import Fraction

calls = 0


def minor(mat, col):
    return [row[:col] + row[col + 1:] for row in mat[1:]]


def det(mat):
    global calls
    calls += 1
    n = len(mat)
    if n == 1:
        return mat[0][0]
    if n == 2:
        return mat[0][0] * mat[1][1] - mat[0][1] * mat[1][0]
    total = 0
    sign = 1
    for col in range(n):
        if mat[0][col] != 0:
            total += sign * mat[0][col] * det(minor(mat, col))
        sign = -sign
    return total


import sys

blocks = sys.stdin.read().strip().split("\n\n")
for number, block in enumerate(blocks, 1):
    mat = [[int(x) for x in line.split()] for line in block.splitlines()]
    calls = 0
    d = det(mat)
    print(f"matrix {number} ({len(mat)}x{len(mat)}): det = {d}, recursive calls = {calls}")
    if d != 0 and len(mat) == 2:
        inv = [[Fraction(mat[1][1], d), Fraction(-mat[0][1], d)],
               [Fraction(-mat[1][0], d), Fraction(mat[0][0], d)]]
        for row in inv:
            print("   inverse row: " + "  ".join(str(v) for v in row))
    elif d == 0:
        print("   singular matrix")
