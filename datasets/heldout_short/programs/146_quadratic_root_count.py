a, b, c = map(int, input().split())
disc = b * b - 4 * a * c
if disc > 0:
    kind = "two real roots"
elif disc == 0:
    kind = "one real root"
else:
    kind = "no real roots"
print(disc)
print(kind)
