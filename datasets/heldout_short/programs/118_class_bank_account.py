class Account:
    def __init__(self, balance):
        self.balance = balance
        self.log = []

    def withdraw(self, amount):
        if amount > self.balance:
            self.log.append("denied")
            return False
        self.balance -= amount
        self.log.append("ok")
        return True


start, w1, w2 = map(int, input().split())
acct = Account(start)
acct.withdraw(w1)
acct.withdraw(w2)
acct.withdraw(w2)
print(acct.balance, acct.log)
