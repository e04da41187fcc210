times = list(map(int, input().split()))
waits = []
clock = 0
for t in times:
    waits.append(clock)
    clock += t
print(waits)
print(sum(waits))
print(sum(waits) / len(waits))
