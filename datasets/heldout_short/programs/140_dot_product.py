xs = list(map(int, input().split()))
ys = list(map(int, input().split()))
total = 0
for x, y in zip(xs, ys):
    total += x * y
print(total)
