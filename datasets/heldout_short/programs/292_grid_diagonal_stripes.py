rows, cols = map(int, input().split())
count = 0
for r in range(rows):
    for c in range(cols):
        if (r + c) % 3 == 0:
            count += 1
print(count)
