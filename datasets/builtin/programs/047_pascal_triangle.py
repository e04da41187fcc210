rows = int(input())
mod = int(input())
triangle = [[1]]
for r in range(1, rows):
    prev = triangle[-1]
    row = [1]
    for k in range(1, r):
        row.append(prev[k - 1] + prev[k])
    row.append(1)
    triangle.append(row)

width = len(" ".join(map(str, triangle[-1])))
for row in triangle:
    text = " ".join(map(str, row))
    print(text.center(width).rstrip())

print(f"row sums: {[sum(row) for row in triangle]}")
pattern = []
for row in triangle:
    line = "".join("#" if v % mod else "." for v in row)
    pattern.append(line)
print(f"entries not divisible by {mod}:")
for line in pattern:
    print("  " + line)
