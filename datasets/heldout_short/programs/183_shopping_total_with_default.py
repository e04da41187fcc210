prices = {"apple": 3, "bread": 5, "milk": 4, "eggs": 6}
total = 0
unknown = 0
for item in input().split():
    if item not in prices:
        unknown += 1
    total += prices.get(item, 10)
print(total)
print(unknown, "unpriced")
