from functools import lru_cache
import sys

data = sys.stdin.read().split()
capacity = int(data[0])
items = []
for i in range(1, len(data), 3):
    items.append((data[i], int(data[i + 1]), int(data[i + 2])))


@lru_cache(maxsize=None)
def best(index, room):
    if index == len(items):
        return 0
    name, weight, value = items[index]
    skip = best(index + 1, room)
    if weight > room:
        return skip
    take = value + best(index + 1, room - weight)
    return max(skip, take)


chosen = []
room = capacity
for index, (name, weight, value) in enumerate(items):
    if best(index, room) != best(index + 1, room):
        chosen.append(name)
        room -= weight

print("capacity:", capacity)
print("best value:", best(0, capacity))
print("chosen:", ", ".join(chosen))
used = sum(w for n, w, v in items if n in chosen)
print(f"weight used: {used}/{capacity}")
ratio_order = sorted(items, key=lambda it: it[2] / it[1], reverse=True)
greedy_value = 0
greedy_room = capacity
for name, weight, value in ratio_order:
    if weight <= greedy_room:
        greedy_room -= weight
        greedy_value += value
print("greedy would get:", greedy_value)
print("states cached:", best.cache_info().currsize)
