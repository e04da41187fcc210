s = input()
upper = sum(1 for c in s if c.isupper())
lower = sum(1 for c in s if c.islower())
print(upper, lower)
