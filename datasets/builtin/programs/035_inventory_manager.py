from collections import defaultdict

stock = defaultdict(int)
prices = {}
revenue = 0.0
rejected = []
n = int(input())
for _ in range(n):
    parts = input().split()
    action = parts[0]
    item = parts[1]
    qty = int(parts[2])
    if action == "add":
        stock[item] += qty
        prices[item] = float(parts[3])
    elif action == "sell":
        if stock[item] >= qty:
            stock[item] -= qty
            revenue += qty * prices[item]
        else:
            rejected.append(f"{item}x{qty}")
    elif action == "remove":
        removed = min(qty, stock[item])
        stock[item] -= removed

print("item      qty   price    value")
total_value = 0.0
for item in sorted(stock):
    qty = stock[item]
    price = prices.get(item, 0.0)
    value = qty * price
    total_value += value
    print(f"{item:<8}{qty:>5}{price:>8.2f}{value:>9.2f}")
print(f"stock value: {total_value:.2f}")
print(f"revenue: {revenue:.2f}")
print("rejected sales:", rejected if rejected else "none")
empty = [item for item in sorted(stock) if stock[item] == 0]
print("out of stock:", empty)
