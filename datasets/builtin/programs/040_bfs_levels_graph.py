from collections import deque, defaultdict

adj = defaultdict(list)
start = None
for line in open(0):
    parts = line.split()
    if not parts:
        continue
    if parts[0] == "start":
        start = parts[1]
        continue
    node = parts[0].rstrip(":")
    for nb in parts[1:]:
        adj[node].append(nb)
        adj[nb].append(node)

level = {start: 0}
parent = {start: None}
queue = deque([start])
order = []
while queue:
    cur = queue.popleft()
    order.append(cur)
    for nb in sorted(adj[cur]):
        if nb not in level:
            level[nb] = level[cur] + 1
            parent[nb] = cur
            queue.append(nb)

print("bfs order:", " ".join(order))
max_level = max(level.values())
for lv in range(max_level + 1):
    nodes = sorted(n for n in level if level[n] == lv)
    print(f"level {lv}: {' '.join(nodes)}")
unreached = sorted(n for n in adj if n not in level)
print("unreached:", unreached)
far = order[-1]
path = []
while far is not None:
    path.append(far)
    far = parent[far]
print("path to last visited:", " <- ".join(path))
