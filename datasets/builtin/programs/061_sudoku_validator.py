import sys

rows = [[int(ch) for ch in line.split()] for line in sys.stdin.read().strip().splitlines()]
problems = []
full = set(range(1, 10))
for r in range(9):
    row_set = set(rows[r])
    if row_set != full:
        missing = sorted(full - row_set)
        problems.append(f"row {r + 1} missing {missing}")
for c in range(9):
    col_set = {rows[r][c] for r in range(9)}
    if col_set != full:
        missing = sorted(full - col_set)
        problems.append(f"col {c + 1} missing {missing}")
for br in range(3):
    for bc in range(3):
        box = set()
        for r in range(br * 3, br * 3 + 3):
            for c in range(bc * 3, bc * 3 + 3):
                box.add(rows[r][c])
        if box != full:
            missing = sorted(full - box)
            problems.append(f"box ({br + 1},{bc + 1}) missing {missing}")

diag = sum(rows[i][i] for i in range(9))
anti = sum(rows[i][8 - i] for i in range(9))
print("diagonal sums:", diag, anti)
if problems:
    print(f"INVALID: {len(problems)} problems")
    for p in problems:
        print("  " + p)
else:
    print("VALID sudoku")
