def step(board):
    rows = len(board)
    cols = len(board[0])
    nxt = [[0] * cols for _ in range(rows)]
    for r in range(rows):
        for c in range(cols):
            alive = 0
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    if dr == 0 and dc == 0:
                        continue
                    rr = (r + dr) % rows
                    cc = (c + dc) % cols
                    alive += board[rr][cc]
            if board[r][c] == 1 and alive in (2, 3):
                nxt[r][c] = 1
            elif board[r][c] == 0 and alive == 3:
                nxt[r][c] = 1
    return nxt


generations = int(input())
board = []
for line in iter(input, ""):
    board.append([1 if ch == "#" else 0 for ch in line.strip()])

for gen in range(generations + 1):
    population = sum(map(sum, board))
    print(f"generation {gen}, population {population}")
    if gen == 0 or gen == generations:
        for row in board:
            print("".join("#" if v else "." for v in row))
    board = step(board)
