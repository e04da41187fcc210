n = input().strip()
power = len(n)
total = sum(int(d) ** power for d in n)
print(n, "is" if total == int(n) else "is not", "an Armstrong number")
