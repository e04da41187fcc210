class VendingError(Exception):
    pass


class Transaction:
    def __init__(self, machine):
        self.machine = machine

    def __enter__(self):
        self.snapshot = (dict(self.machine.stock), self.machine.credit)
        return self.machine

    def __exit__(self, exc_type, exc, tb):
        if exc_type is VendingError:
            self.machine.stock, self.machine.credit = self.snapshot
            print(f"  rolled back: {exc}")
            return True
        return False


class Machine:
    def __init__(self, stock, prices):
        self.stock = stock
        self.prices = prices
        self.credit = 0
        self.bank = 0

    def insert(self, cents):
        if cents not in (5, 10, 25, 100):
            raise VendingError(f"rejected coin {cents}")
        self.credit += cents

    def buy(self, item):
        if self.stock.get(item, 0) == 0:
            raise VendingError(f"{item} sold out")
        price = self.prices[item]
        if self.credit < price:
            raise VendingError(f"{item} needs {price - self.credit} more")
        self.stock[item] -= 1
        change = self.credit - price
        self.bank += price
        self.credit = 0
        return change


machine = Machine({"chips": 2, "soda": 1, "gum": 0}, {"chips": 75, "soda": 125, "gum": 35})
for line in open(0).read().strip().splitlines():
    item, *coins = line.split()
    print(f"order {item} with {coins}")
    with Transaction(machine) as m:
        for coin in coins:
            m.insert(int(coin))
        change = m.buy(item)
        print(f"  vended {item}, change {change}")
print("stock:", sorted(machine.stock.items()))
print("bank:", machine.bank, "credit left:", machine.credit)
