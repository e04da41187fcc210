limit = int(input())
triples = []
for a in range(1, limit):
    for b in range(a, limit):
        c = (a * a + b * b) ** 0.5
        if c == int(c) and c <= limit:
            triples.append((a, b, int(c)))
print(len(triples))
print(triples[0])
print(triples[-1])
