total = 0
for x in map(int, input().split()):
    if x < 0:
        break
    total += x
print(total)
