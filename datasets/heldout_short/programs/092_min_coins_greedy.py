amount = int(input())
coins = [25, 10, 5, 1]
used = 0
for c in coins:
    used += amount // c
    amount %= c
print(used)
