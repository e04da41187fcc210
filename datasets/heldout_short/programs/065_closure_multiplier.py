def make_multiplier(k):
    def mul(x):
        return x * k
    return mul


k = int(input())
triple = make_multiplier(3)
by_k = make_multiplier(k)
print(triple(k), by_k(10))
