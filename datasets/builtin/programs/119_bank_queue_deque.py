from collections import deque
import sys

tellers = int(sys.stdin.readline())
customers = deque()
for line in sys.stdin:
    name, arrive, service = line.split()
    customers.append((name, int(arrive), int(service)))

busy_until = [0] * tellers
served_by = [[] for _ in range(tellers)]
waiting = deque()
clock = 0
total_wait = 0
max_queue = 0
while customers or waiting:
    while customers and customers[0][1] <= clock:
        waiting.append(customers.popleft())
    max_queue = max(max_queue, len(waiting))
    for t in range(tellers):
        if busy_until[t] <= clock and waiting:
            name, arrive, service = waiting.popleft()
            total_wait += clock - arrive
            busy_until[t] = clock + service
            served_by[t].append(name)
            print(f"t={clock:>2}: teller {t} takes {name} (waited {clock - arrive})")
    clock += 1

finish = max(busy_until)
print("all done at", finish)
for t, names in enumerate(served_by):
    print(f"teller {t}: {' '.join(names) or '-'}")
served = sum(len(n) for n in served_by)
print(f"avg wait {total_wait / served:.2f}, longest queue {max_queue}")
