balance = 0
lowest = 0
for change in map(int, input().split()):
    balance += change
    lowest = min(lowest, balance)
print("final", balance)
print("lowest", lowest)
