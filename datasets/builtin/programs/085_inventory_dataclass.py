from dataclasses import dataclass, field


@dataclass
class Item:
    sku: str
    name: str
    qty: int
    price: float
    tags: list = field(default_factory=list)

    @property
    def value(self):
        return self.qty * self.price


inventory = {}
lines = open(0).read().splitlines()
count = int(lines[0])
for raw in lines[1:1 + count]:
    sku, name, qty, price, *tags = raw.split(",")
    inventory[sku] = Item(sku, name, int(qty), float(price), tags)

restocked = 0
sold = 0
for raw in lines[1 + count:]:
    action, sku, amount = raw.split()
    amount = int(amount)
    item = inventory.get(sku)
    if item is None:
        print(f"unknown sku {sku}")
        continue
    if action == "sell":
        taken = min(amount, item.qty)
        item.qty -= taken
        sold += taken
    else:
        item.qty += amount
        restocked += amount

print(inventory["A1"])
total_value = 0.0
for item in sorted(inventory.values(), key=lambda it: -it.value):
    total_value += item.value
    flag = "LOW" if item.qty < 5 else "ok"
    print(f"{item.sku:<4}{item.name:<10}{item.qty:>4}{item.value:>9.2f} {flag}")
print(f"sold={sold} restocked={restocked} total={total_value:,.2f}")
