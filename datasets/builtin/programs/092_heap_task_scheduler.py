import heapq
import sys

tasks = []
for line in sys.stdin:
    parts = line.split()
    if len(parts) != 3:
        continue
    name, arrival, duration = parts[0], int(parts[1]), int(parts[2])
    tasks.append((arrival, name, duration))
tasks.sort()

ready = []
clock = 0
idx = 0
finished = []
waits = {}
while idx < len(tasks) or ready:
    while idx < len(tasks) and tasks[idx][0] <= clock:
        arrival, name, duration = tasks[idx]
        heapq.heappush(ready, (duration, arrival, name))
        idx += 1
    if not ready:
        clock = tasks[idx][0]
        continue
    duration, arrival, name = heapq.heappop(ready)
    waits[name] = clock - arrival
    clock += duration
    finished.append((name, clock))

for name, end in finished:
    print(f"{name:<6} done at {end:>3}  waited {waits[name]}")
avg = sum(waits.values()) / len(waits)
print(f"average wait: {avg:.2f}")
print("makespan:", clock)
