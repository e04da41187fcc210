WHITE, GRAY, BLACK = 0, 1, 2


def find_cycle(n, adj):
    color = [WHITE] * n
    stack_path = []

    def visit(u):
        color[u] = GRAY
        stack_path.append(u)
        for v in adj[u]:
            if color[v] == GRAY:
                start = stack_path.index(v)
                return stack_path[start:] + [v]
            if color[v] == WHITE:
                found = visit(v)
                if found:
                    return found
        stack_path.pop()
        color[u] = BLACK
        return None

    for node in range(n):
        if color[node] == WHITE:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


graphs = int(input())
for g in range(1, graphs + 1):
    n, m = map(int, input().split())
    adj = [[] for _ in range(n)]
    for _ in range(m):
        u, v = map(int, input().split())
        adj[u].append(v)
    cycle = find_cycle(n, adj)
    out_degrees = [len(a) for a in adj]
    if cycle:
        print(f"graph {g}: cycle {' -> '.join(map(str, cycle))}")
    else:
        print(f"graph {g}: acyclic")
    print(f"   out-degrees {out_degrees}")
