n = int(input())
r = 0
while (r + 1) * (r + 1) <= n:
    r += 1
print(r)
print(n - r * r)
