n = int(input())
mod = int(input())

triangle = [[1]]
for i in range(1, n):
    prev = triangle[-1]
    row = [1]
    for a, b in zip(prev, prev[1:]):
        row.append(a + b)
    row.append(1)
    triangle.append(row)

width = len(" ".join(map(str, triangle[-1])))
for row in triangle:
    print(" ".join(map(str, row)).center(width).rstrip())

print()
for row in triangle:
    pattern = "".join("*" if v % mod else " " for v in row)
    print((" " * (n - len(row)) + " ".join(pattern)).rstrip())

sums = [sum(row) for row in triangle]
print("row sums:", sums)
diagonals = []
for start in range(n):
    total = 0
    r, c = start, 0
    while r >= c:
        total += triangle[r][c]
        r -= 1
        c += 1
    diagonals.append(total)
print("shallow diagonals:", diagonals)
odd = sum(1 for row in triangle for v in row if v % 2)
print(f"odd entries: {odd} of {sum(len(r) for r in triangle)}")
