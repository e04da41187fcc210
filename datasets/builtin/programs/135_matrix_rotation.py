def rotate_cw(m):
    return [list(row) for row in zip(*m[::-1])]


def flip_h(m):
    return [row[::-1] for row in m]


def show(title, m):
    print(title)
    for row in m:
        print("  " + " ".join(str(v).rjust(2) for v in row))


n = int(input())
grid = [input().split() for _ in range(n)]
commands = input().split()

current = grid
for cmd in commands:
    if cmd == "R":
        current = rotate_cw(current)
    elif cmd == "L":
        for _ in range(3):
            current = rotate_cw(current)
    elif cmd == "F":
        current = flip_h(current)
    else:
        print("unknown command", cmd)
        continue
show("after " + "".join(c for c in commands if c in "RLF") + ":", current)

seen = []
state = grid
while state not in seen:
    seen.append(state)
    state = flip_h(rotate_cw(state))
print("orbit length of RF:", len(seen))
turns = 1
spun = rotate_cw(grid)
while spun != grid:
    spun = rotate_cw(spun)
    turns += 1
print("rotations to return:", turns)
symmetric = grid == [list(r) for r in zip(*grid)]
print("symmetric:", symmetric, "| corners:", grid[0][0], grid[0][-1], grid[-1][0], grid[-1][-1])
