total, people, tip_pct = input().split()
total = float(total)
people = int(people)
tip = total * int(tip_pct) / 100
each = (total + tip) / people
print(f"tip: {tip:.2f}")
print(f"total: {total + tip:.2f}")
print(f"each: {each:.2f}")
