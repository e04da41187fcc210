from collections import defaultdict

n = int(input())
children = defaultdict(list)
parent = {}
values = {}
for _ in range(n):
    node, val, par = input().split()
    values[node] = int(val)
    if par != "-":
        children[par].append(node)
        parent[node] = par
root = next(node for node in values if node not in parent)


def preorder(node, depth=0):
    yield node, depth
    for child in children[node]:
        yield from preorder(child, depth + 1)


def postorder(node):
    for child in children[node]:
        yield from postorder(child)
    yield node


def subtree_sum(node):
    total = values[node]
    for child in children[node]:
        total += subtree_sum(child)
    return total


def height(node):
    if not children[node]:
        return 0
    return 1 + max(height(ch) for ch in children[node])


for node, depth in preorder(root):
    print("  " * depth + f"{node} ({values[node]})")
print("postorder:", " ".join(postorder(root)))
sums = {node: subtree_sum(node) for node in values}
best = max(sums, key=lambda k: (sums[k] if k != root else -1, k))
print("root sum:", sums[root], "height:", height(root))
print("best proper subtree:", best, sums[best])
leaves = [node for node in values if not children[node]]
print("leaves:", sorted(leaves))
