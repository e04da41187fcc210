a, r, n = map(int, input().split())
total = 0
term = a
for _ in range(n):
    total += term
    term *= r
print(total)
print(term // r)
