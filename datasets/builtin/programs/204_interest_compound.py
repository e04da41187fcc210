p, r, years = map(int, input().split())
amount = p * (1 + r / 100) ** years
print(round(amount, 2))
