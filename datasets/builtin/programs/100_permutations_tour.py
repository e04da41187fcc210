from itertools import permutations

n = int(input())
names = input().split()
dist = [list(map(int, input().split())) for _ in range(n)]

best_cost = None
best_route = None
worst_cost = 0
evaluated = 0
for perm in permutations(range(1, n)):
    route = (0,) + perm + (0,)
    cost = 0
    for a, b in zip(route, route[1:]):
        cost += dist[a][b]
    evaluated += 1
    if best_cost is None or cost < best_cost:
        best_cost = cost
        best_route = route
    if cost > worst_cost:
        worst_cost = cost

print("routes evaluated:", evaluated)
print("best:", " -> ".join(names[i] for i in best_route), "=", best_cost)
print("worst cost:", worst_cost)
legs = [dist[a][b] for a, b in zip(best_route, best_route[1:])]
print("legs:", legs)
anagrams = sorted(set("".join(p) for p in permutations("abca", 3)))
print(len(anagrams), anagrams[:6])
