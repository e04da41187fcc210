import heapq
import sys

data = sys.stdin.read().split()
n, m = int(data[0]), int(data[1])
idx = 2
adj = [[] for _ in range(n)]
for _ in range(m):
    u, v, w = int(data[idx]), int(data[idx + 1]), int(data[idx + 2])
    idx += 3
    adj[u].append((v, w))
    adj[v].append((u, w))
source = int(data[idx])

INF = 10 ** 9
dist = [INF] * n
parent = [-1] * n
dist[source] = 0
heap = [(0, source)]
pops = 0
while heap:
    d, u = heapq.heappop(heap)
    pops += 1
    if d > dist[u]:
        continue
    for v, w in adj[u]:
        nd = d + w
        if nd < dist[v]:
            dist[v] = nd
            parent[v] = u
            heapq.heappush(heap, (nd, v))

for node in range(n):
    path = []
    cur = node
    while cur != -1:
        path.append(cur)
        cur = parent[cur]
    shown = "->".join(map(str, reversed(path))) if dist[node] < INF else "unreachable"
    print(f"node {node}: dist {dist[node] if dist[node] < INF else 'inf':>3}  path {shown}")
print("heap pops:", pops)
