s = input().strip()
total = 0
for d in s:
    total += int(d)
print(total)
