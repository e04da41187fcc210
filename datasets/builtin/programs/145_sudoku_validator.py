import sys

tokens = sys.stdin.read().split()
board = [[int(ch) for ch in row] for row in tokens[:9]]
problems = []


def check(group, label):
    seen = set()
    for value in group:
        if value == 0:
            continue
        if value in seen:
            problems.append(f"{label}: duplicate {value}")
            return False
        seen.add(value)
    return True


valid_rows = sum(check(board[r], f"row {r + 1}") for r in range(9))
valid_cols = sum(check([board[r][c] for r in range(9)], f"col {c + 1}") for c in range(9))
valid_boxes = 0
for br in range(3):
    for bc in range(3):
        cells = [board[r][c] for r in range(br * 3, br * 3 + 3) for c in range(bc * 3, bc * 3 + 3)]
        valid_boxes += check(cells, f"box {br * 3 + bc + 1}")

empty = sum(row.count(0) for row in board)
print(f"rows ok: {valid_rows}/9, cols ok: {valid_cols}/9, boxes ok: {valid_boxes}/9")
print("empty cells:", empty)
for p in problems:
    print("  " + p)
r, c = 0, 0
for r in range(9):
    if 0 in board[r]:
        c = board[r].index(0)
        break
used = set(board[r]) | {board[i][c] for i in range(9)}
used |= {board[i][j] for i in range(r // 3 * 3, r // 3 * 3 + 3) for j in range(c // 3 * 3, c // 3 * 3 + 3)}
candidates = sorted(set(range(1, 10)) - used)
print(f"first empty cell ({r + 1},{c + 1}) candidates: {candidates}")
