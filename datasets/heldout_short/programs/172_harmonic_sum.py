n = int(input())
total = 0.0
for k in range(1, n + 1):
    total += 1 / k
print(round(total, 4))
