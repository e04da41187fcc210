import sys

n, m = map(int, sys.stdin.readline().split())
adj = [[] for _ in range(n + 1)]
for _ in range(m):
    u, v = map(int, sys.stdin.readline().split())
    adj[u].append(v)
    adj[v].append(u)

seen = set()
components = []
for root in range(1, n + 1):
    if root in seen:
        continue
    bucket = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        bucket.append(node)
        for nxt in sorted(adj[node], reverse=True):
            if nxt not in seen:
                stack.append(nxt)
    components.append(bucket)

print("components:", len(components))
for idx, comp in enumerate(components, 1):
    edges = sum(len(adj[v]) for v in comp) // 2
    kind = "tree" if edges == len(comp) - 1 else "has cycle"
    print(f"#{idx}: visit order {comp} edges={edges} {kind}")
sizes = sorted((len(c) for c in components), reverse=True)
print("sizes:", sizes)
isolated = {v for v in range(1, n + 1) if not adj[v]}
print("isolated vertices:", sorted(isolated) if isolated else "none")
