name, qty, price = input().split()
qty, price = int(qty), float(price)
print(f"{name:<10}|{qty:>3}|{qty * price:>8.2f}")
