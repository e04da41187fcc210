a1, a2 = map(int, input().split())
b1, b2 = map(int, input().split())
overlap = min(a2, b2) - max(a1, b1)
print(max(0, overlap))
