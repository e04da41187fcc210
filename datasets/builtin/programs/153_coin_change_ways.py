from functools import lru_cache

coins = tuple(sorted(map(int, input().split()), reverse=True))
amounts = list(map(int, input().split()))


@lru_cache(maxsize=None)
def ways(amount, index=0):
    if amount == 0:
        return 1
    if amount < 0 or index == len(coins):
        return 0
    return ways(amount - coins[index], index) + ways(amount, index + 1)


def fewest(amount):
    best = [0] + [None] * amount
    pick = [0] * (amount + 1)
    for value in range(1, amount + 1):
        for coin in coins:
            if coin <= value and best[value - coin] is not None:
                candidate = best[value - coin] + 1
                if best[value] is None or candidate < best[value]:
                    best[value] = candidate
                    pick[value] = coin
    if best[amount] is None:
        return None, []
    count = best[amount]
    used = []
    while amount:
        used.append(pick[amount])
        amount -= pick[amount]
    return count, used


print("coins:", coins)
for amount in amounts:
    count, used = fewest(amount)
    if count is None:
        print(f"{amount:>4}: impossible, ways=0")
        continue
    print(f"{amount:>4}: {ways(amount):>5} ways, fewest {count} coins {used}")
print("cache entries:", ways.cache_info().currsize)
