def winner(board):
    lines = []
    for i in range(3):
        lines.append(board[i])
        lines.append("".join(board[r][i] for r in range(3)))
    lines.append("".join(board[i][i] for i in range(3)))
    lines.append("".join(board[i][2 - i] for i in range(3)))
    for line in lines:
        if line == "XXX":
            return "X"
        if line == "OOO":
            return "O"
    return None


games = int(input())
tally = {"X": 0, "O": 0, "draw": 0, "ongoing": 0}
for g in range(1, games + 1):
    board = [input().strip() for _ in range(3)]
    x_count = sum(row.count("X") for row in board)
    o_count = sum(row.count("O") for row in board)
    empty = 9 - x_count - o_count
    w = winner(board)
    if w is not None:
        result = f"{w} wins"
        tally[w] += 1
    elif empty == 0:
        result = "draw"
        tally["draw"] += 1
    else:
        turn = "X" if x_count == o_count else "O"
        result = f"in progress, {turn} to move"
        tally["ongoing"] += 1
    print(f"game {g}: X={x_count} O={o_count} empty={empty} -> {result}")
for key in ("X", "O", "draw", "ongoing"):
    print(f"{key:>8}: {tally[key]}")
