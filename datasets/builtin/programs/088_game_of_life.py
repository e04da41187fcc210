rows, cols, gens = map(int, input().split())
grid = [[1 if ch == "#" else 0 for ch in input().strip()] for _ in range(rows)]


def neighbours(g, r, c):
    total = 0
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if dr == 0 and dc == 0:
                continue
            nr, nc = (r + dr) % rows, (c + dc) % cols
            total += g[nr][nc]
    return total


def step(g):
    new = [[0] * cols for _ in range(rows)]
    for r in range(rows):
        for c in range(cols):
            n = neighbours(g, r, c)
            if g[r][c] and n in (2, 3):
                new[r][c] = 1
            elif not g[r][c] and n == 3:
                new[r][c] = 1
    return new


population = []
for gen in range(gens + 1):
    alive = sum(map(sum, grid))
    population.append(alive)
    if gen in (0, gens):
        print(f"generation {gen}:")
        for row in grid:
            print("".join("#" if x else "." for x in row))
    grid = step(grid)
print("population:", population)
