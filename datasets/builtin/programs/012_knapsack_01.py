import sys

tokens = sys.stdin.read().split()
n = int(tokens[0])
capacity = int(tokens[1])
items = []
pos = 2
for _ in range(n):
    name = tokens[pos]
    weight = int(tokens[pos + 1])
    value = int(tokens[pos + 2])
    items.append((name, weight, value))
    pos += 3

table = [[0] * (capacity + 1) for _ in range(n + 1)]
for i in range(1, n + 1):
    name, weight, value = items[i - 1]
    for w in range(capacity + 1):
        skip = table[i - 1][w]
        if weight <= w:
            take = table[i - 1][w - weight] + value
            table[i][w] = max(skip, take)
        else:
            table[i][w] = skip

chosen = []
w = capacity
for i in range(n, 0, -1):
    if table[i][w] != table[i - 1][w]:
        name, weight, value = items[i - 1]
        chosen.append(name)
        w -= weight
chosen.reverse()
used = capacity - w
print("capacity:", capacity)
print("best value:", table[n][capacity])
print("weight used:", used)
print("items taken:", ", ".join(chosen))
print("row by item:", [table[i][capacity] for i in range(n + 1)])
