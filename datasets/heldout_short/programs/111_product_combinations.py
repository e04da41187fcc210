from itertools import product

letters, k = input().split()
combos = ["".join(p) for p in product(letters, repeat=int(k))]
print(combos)
