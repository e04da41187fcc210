import heapq
from collections import defaultdict

graph = defaultdict(list)
edge_count = int(input())
for _ in range(edge_count):
    a, b, w = input().split()
    graph[a].append((b, int(w)))
    graph[b].append((a, int(w)))
source = input().strip()

dist = {source: 0}
prev = {}
heap = [(0, source)]
visited = []
while heap:
    d, node = heapq.heappop(heap)
    if d > dist[node]:
        continue
    visited.append(node)
    for nxt, w in graph[node]:
        nd = d + w
        if nxt not in dist or nd < dist[nxt]:
            dist[nxt] = nd
            prev[nxt] = node
            heapq.heappush(heap, (nd, nxt))


def path_to(target):
    path = [target]
    while path[-1] != source:
        path.append(prev[path[-1]])
    return path[::-1]


print("visit order:", " ".join(visited))
for node in sorted(dist, key=lambda n: (dist[n], n)):
    print(f"{node:<3} {dist[node]:>3}  via {'-'.join(path_to(node))}")
farthest = max(dist, key=lambda n: (dist[n], n))
print("farthest:", farthest, dist[farthest])
