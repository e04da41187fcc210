from collections import defaultdict
import heapq

n_edges = int(input())
graph = defaultdict(list)
indegree = {}
for _ in range(n_edges):
    before, after = input().split()
    graph[before].append(after)
    indegree.setdefault(before, 0)
    indegree[after] = indegree.get(after, 0) + 1

ready = [task for task, deg in indegree.items() if deg == 0]
heapq.heapify(ready)
order = []
level = {task: 0 for task in ready}
while ready:
    task = heapq.heappop(ready)
    order.append(task)
    for nxt in graph[task]:
        indegree[nxt] -= 1
        level[nxt] = max(level.get(nxt, 0), level[task] + 1)
        if indegree[nxt] == 0:
            heapq.heappush(ready, nxt)

if len(order) < len(indegree):
    print("cycle detected")
else:
    print("build order:", " -> ".join(order))
depth = max(level.values())
for lv in range(depth + 1):
    stage = sorted(t for t in level if level[t] == lv)
    print(f"stage {lv}: {', '.join(stage)}")
print("tasks:", len(order), "stages:", depth + 1)
