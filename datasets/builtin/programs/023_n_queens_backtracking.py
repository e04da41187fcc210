def solve(n):
    solutions = []
    cols = set()
    diag1 = set()
    diag2 = set()
    placement = []

    def place(row):
        if row == n:
            solutions.append(placement[:])
            return
        for col in range(n):
            if col in cols or row - col in diag1 or row + col in diag2:
                continue
            cols.add(col)
            diag1.add(row - col)
            diag2.add(row + col)
            placement.append(col)
            place(row + 1)
            placement.pop()
            cols.discard(col)
            diag1.discard(row - col)
            diag2.discard(row + col)

    place(0)
    return solutions


sizes = [int(x) for x in input().split()]
show = int(input())
for n in sizes:
    sols = solve(n)
    print(f"{n}-queens: {len(sols)} solutions")
sols = solve(show)
first = sols[0]
print(f"first solution for n={show}: {first}")
for col in first:
    line = ["."] * show
    line[col] = "Q"
    print(" ".join(line))
