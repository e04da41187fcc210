class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return (self.a, self.b) == (other.a, other.b)


v = list(map(int, input().split()))
print(Pair(v[0], v[1]) == Pair(v[2], v[3]))
