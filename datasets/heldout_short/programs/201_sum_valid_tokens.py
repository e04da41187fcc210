total = 0
bad = []
for tok in input().split():
    try:
        total += int(tok)
    except ValueError:
        bad.append(tok)
print(total)
print(bad)
