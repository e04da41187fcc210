orders = {}
for entry in input().split():
    customer, item, qty = entry.split(":")
    orders.setdefault(customer, {})
    orders[customer][item] = orders[customer].get(item, 0) + int(qty)
print(orders)
print({c: sum(v.values()) for c, v in orders.items()})
