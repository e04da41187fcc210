r1 = list(map(int, input().split()))
r2 = list(map(int, input().split()))
print([a + b for a, b in zip(r1, r2)])
