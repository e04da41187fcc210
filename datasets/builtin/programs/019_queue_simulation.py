from collections import deque

num_tellers = int(input())
arrivals = []
for line in iter(input, "end"):
    name, arrive, service = line.split()
    arrivals.append((int(arrive), name, int(service)))
arrivals.sort()

free_at = [0] * num_tellers
waits = {}
finish_order = []
queue = deque(arrivals)
while queue:
    arrive, name, service = queue.popleft()
    teller = min(range(num_tellers), key=lambda t: free_at[t])
    begin = max(arrive, free_at[teller])
    wait = begin - arrive
    end = begin + service
    free_at[teller] = end
    waits[name] = wait
    finish_order.append((end, name))
    print(f"t={begin:3d} teller {teller} serves {name:<6} waited {wait:2d}, done at {end}")

finish_order.sort()
avg_wait = sum(waits.values()) / len(waits)
longest = max(waits.items(), key=lambda kv: (kv[1], kv[0]))
print("finish order:", " ".join(n for _, n in finish_order))
print(f"average wait: {avg_wait:.2f}")
print(f"longest wait: {longest[0]} ({longest[1]})")
