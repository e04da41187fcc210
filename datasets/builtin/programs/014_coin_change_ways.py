coins = list(map(int, input().split()))
targets = list(map(int, input().split()))
limit = max(targets)

ways = [0] * (limit + 1)
ways[0] = 1
for coin in coins:
    for amount in range(coin, limit + 1):
        ways[amount] += ways[amount - coin]

INF = float("inf")
fewest = [INF] * (limit + 1)
fewest[0] = 0
for amount in range(1, limit + 1):
    for coin in coins:
        if coin <= amount and fewest[amount - coin] + 1 < fewest[amount]:
            fewest[amount] = fewest[amount - coin] + 1

print("coins:", coins)
for t in targets:
    if fewest[t] == INF:
        minimum = "impossible"
    else:
        minimum = str(fewest[t])
    print(f"amount {t:3d}: {ways[t]:5d} ways, fewest coins = {minimum}")
no_way = [a for a in range(1, limit + 1) if ways[a] == 0]
print("unreachable amounts:", no_way)
