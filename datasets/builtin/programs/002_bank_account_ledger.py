import sys


class Account:
    def __init__(self, owner, balance):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        self.balance += amount
        self.history.append(("dep", amount))

    def withdraw(self, amount):
        if amount > self.balance:
            return False
        self.balance -= amount
        self.history.append(("wd", amount))
        return True

    def undo(self):
        if not self.history:
            return None
        kind, amount = self.history.pop()
        if kind == "dep":
            self.balance -= amount
        else:
            self.balance += amount
        return kind, amount


lines = sys.stdin.read().splitlines()
owner, start = lines[0].split()
acct = Account(owner, int(start))
failed = 0
for raw in lines[1:]:
    parts = raw.split()
    op = parts[0]
    if op == "undo":
        undone = acct.undo()
        print(f"undo     {undone[1] if undone else '-':>5} -> balance {acct.balance:>6}")
        continue
    amount = int(parts[1])
    if op == "deposit":
        acct.deposit(amount)
    elif op == "withdraw" and not acct.withdraw(amount):
        failed += 1
    print(f"{op:<8} {amount:>5} -> balance {acct.balance:>6}")

deposits = sum(a for kind, a in acct.history if kind == "dep")
withdrawals = sum(a for kind, a in acct.history if kind == "wd")
print("owner:", acct.owner)
print("total deposited:", deposits)
print("total withdrawn:", withdrawals)
print("failed withdrawals:", failed)
