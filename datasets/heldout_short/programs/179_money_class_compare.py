class Money:
    def __init__(self, cents):
        self.cents = cents

    def __lt__(self, other):
        return self.cents < other.cents

    def __str__(self):
        return f"${self.cents // 100}.{self.cents % 100:02d}"


amounts = [Money(int(x)) for x in input().split()]
print(min(amounts))
print(max(amounts))
