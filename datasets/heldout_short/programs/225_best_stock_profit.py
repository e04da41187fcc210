prices = list(map(int, input().split()))
lowest = prices[0]
best = 0
buy_at = sell_at = prices[0]
for p in prices[1:]:
    if p - lowest > best:
        best = p - lowest
        buy_at, sell_at = lowest, p
    lowest = min(lowest, p)
print("buy", buy_at)
print("sell", sell_at)
print("profit", best)
