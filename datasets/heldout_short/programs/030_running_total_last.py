nums = list(map(int, input().split()))
running = []
total = 0
for x in nums:
    total += x
    running.append(total)
print(running[-1])
print(running[len(running) // 2])
