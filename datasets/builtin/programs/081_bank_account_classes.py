class InsufficientFunds(Exception):
    pass

class Account:
    bank_name = "Riverside"
    count = 0

    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        Account.count += 1

    def deposit(self, amount):
        self.balance += amount
        return self.balance

    def withdraw(self, amount):
        if amount > self.balance:
            shortfall = amount - self.balance
            raise InsufficientFunds(f"{self.owner} is short by {shortfall}")
        self.balance -= amount
        return self.balance

    def __repr__(self):
        return f"Account({self.owner!r}, {self.balance})"

class SavingsAccount(Account):
    rate = 0.05

    def add_interest(self):
        interest = round(self.balance * self.rate, 2)
        self.balance += interest
        return interest

accounts = {}
n = int(input())
for _ in range(n):
    kind, owner, amount = input().split()
    cls = SavingsAccount if kind == "S" else Account
    accounts[owner] = cls(owner, int(amount))

ops = int(input())
for _ in range(ops):
    op, owner, amount = input().split()
    acct = accounts[owner]
    try:
        if op == "dep":
            result = acct.deposit(int(amount))
        else:
            result = acct.withdraw(int(amount))
    except InsufficientFunds as exc:
        print("error:", exc)
    else:
        print(f"{op} {owner}: {result}")

for acct in accounts.values():
    if isinstance(acct, SavingsAccount):
        gained = acct.add_interest()
        print(f"interest for {acct.owner}: {gained}")
print(Account.bank_name, Account.count, sorted(accounts.values(), key=lambda a: a.balance))
