from dataclasses import dataclass
from collections import defaultdict


@dataclass
class Expense:
    day: int
    category: str
    amount: float
    note: str


budget = {}
expenses = []
section = None
for line in open(0).read().splitlines():
    if line.startswith("#"):
        section = line[1:].strip()
        continue
    if section == "budget":
        category, limit = line.split("=")
        budget[category.strip()] = float(limit)
    else:
        day, category, amount, note = line.split(maxsplit=3)
        expenses.append(Expense(int(day), category, float(amount), note))

by_category = defaultdict(list)
for e in expenses:
    by_category[e.category].append(e)

grand_total = 0.0
for category in sorted(by_category, key=lambda c: -sum(e.amount for e in by_category[c])):
    items = sorted(by_category[category], key=lambda e: (e.day, -e.amount))
    spent = sum(e.amount for e in items)
    grand_total += spent
    limit = budget.get(category)
    if limit is None:
        status = "no budget"
    elif spent > limit:
        status = f"OVER by {spent - limit:.2f}"
    else:
        status = f"{spent / limit:.0%} used"
    print(f"{category:<10}{spent:>9.2f}  {status}")
    for e in items:
        print(f"    day {e.day:>2}  {e.amount:>7.2f}  {e.note}")
unused = sorted(set(budget) - set(by_category))
print(f"total spent: {grand_total:,.2f}; unused budgets: {unused}")
