rate = float(input())
balance = 1.0
years = 0
while balance < 2:
    balance *= 1 + rate / 100
    years += 1
print(years)
print(round(balance, 4))
