stock = {}
for pair in input().split():
    name, qty = pair.split("=")
    stock[name] = int(qty)
limit = int(input())
low = {k: v for k, v in stock.items() if v < limit}
print(low)
print(sum(stock.values()) - sum(low.values()))
