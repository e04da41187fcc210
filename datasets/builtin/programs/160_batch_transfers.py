from dataclasses import dataclass


class TransferError(Exception):
    pass


@dataclass
class Wallet:
    owner: str
    balance: int
    frozen: bool = False


class Batch:
    def __init__(self, wallets, name):
        self.wallets = wallets
        self.name = name
        self.applied = 0

    def __enter__(self):
        self.saved = {k: w.balance for k, w in self.wallets.items()}
        return self

    def transfer(self, src, dst, amount):
        a, b = self.wallets[src], self.wallets[dst]
        if a.frozen or b.frozen:
            raise TransferError(f"frozen wallet in {src}->{dst}")
        if a.balance < amount:
            raise TransferError(f"{src} has {a.balance}, needs {amount}")
        a.balance -= amount
        b.balance += amount
        self.applied += 1

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            print(f"{self.name}: committed {self.applied} transfers")
            return False
        for key, value in self.saved.items():
            self.wallets[key].balance = value
        print(f"{self.name}: rolled back after {self.applied} ({exc_type.__name__}: {exc})")
        return True


wallets = {}
lines = open(0).read().splitlines()
for token in lines[0].split():
    owner, amount = token.split(":")
    wallets[owner] = Wallet(owner, int(amount), amount.startswith("0"))

batch_lines = [line for line in lines[1:] if line.strip()]
for number, line in enumerate(batch_lines, 1):
    with Batch(wallets, f"batch{number}") as batch:
        for step in line.split(";"):
            src, dst, amount = step.split()
            batch.transfer(src, dst, int(amount))
for w in sorted(wallets.values(), key=lambda w: (-w.balance, w.owner)):
    print(f"  {w.owner:<5} {w.balance:>5}{' (frozen)' if w.frozen else ''}")
print("total money:", sum(w.balance for w in wallets.values()))
