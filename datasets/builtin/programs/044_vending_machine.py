COINS = [200, 100, 50, 20, 10, 5]

products = {}
n = int(input())
for _ in range(n):
    code, name, price, qty = input().split()
    products[code] = [name, int(price), int(qty)]

bank = 0
sales = 0
for line in iter(input, "done"):
    code, paid = line.split()
    paid = int(paid)
    if code not in products:
        print(f"{code}: unknown code, refund {paid}")
        continue
    name, price, qty = products[code]
    if qty == 0:
        print(f"{code}: {name} sold out, refund {paid}")
        continue
    if paid < price:
        print(f"{code}: need {price - paid} more for {name}, refund {paid}")
        continue
    change = paid - price
    coins_out = []
    remaining = change
    for coin in COINS:
        while remaining >= coin:
            coins_out.append(coin)
            remaining -= coin
    products[code][2] -= 1
    bank += price
    sales += 1
    print(f"{code}: {name} for {price}, change {change} as {coins_out}")

print(f"sales: {sales}, takings: {bank / 100:.2f}")
for code in sorted(products):
    name, price, qty = products[code]
    print(f"  {code} {name:<8} left {qty}")
