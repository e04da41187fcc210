size = int(input())
commands = input().strip()
x, y = 0, 0
heading = 0
dirs = [(0, 1), (1, 0), (0, -1), (-1, 0)]
names = "NESW"
visited = {(0, 0): 1}
bumps = 0
for cmd in commands:
    if cmd == "L":
        heading = (heading - 1) % 4
    elif cmd == "R":
        heading = (heading + 1) % 4
    elif cmd == "F":
        dx, dy = dirs[heading]
        nx, ny = x + dx, y + dy
        if 0 <= nx < size and 0 <= ny < size:
            x, y = nx, ny
            visited[(x, y)] = visited.get((x, y), 0) + 1
        else:
            bumps += 1

print(f"final position: ({x}, {y}) facing {names[heading]}")
print("distinct cells visited:", len(visited))
print("wall bumps:", bumps)
for row in range(size - 1, -1, -1):
    line = ""
    for col in range(size):
        if (col, row) == (x, y):
            line += "R"
        elif (col, row) in visited:
            line += str(min(visited[(col, row)], 9))
        else:
            line += "."
    print(line)
