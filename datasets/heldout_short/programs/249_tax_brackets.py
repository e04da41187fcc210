income = int(input())
brackets = [(10000, 0.0), (30000, 0.1), (None, 0.25)]
tax = 0.0
lower = 0
for upper, rate in brackets:
    if upper is None or income <= upper:
        tax += (income - lower) * rate
        break
    tax += (upper - lower) * rate
    lower = upper
print(f"tax {tax:.2f}")
print(f"net {income - tax:.2f}")
print(f"rate {tax / income:.1%}")
