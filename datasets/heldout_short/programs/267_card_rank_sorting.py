class Card:
    order = "23456789TJQKA"

    def __init__(self, text):
        self.text = text

    def __lt__(self, other):
        return Card.order.index(self.text[0]) < Card.order.index(other.text[0])


hand = [Card(t) for t in input().split()]
print(" ".join(c.text for c in sorted(hand)))
