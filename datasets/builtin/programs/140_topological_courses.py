import heapq
from collections import defaultdict

prereqs = defaultdict(list)
indegree = {}
lines = open(0).read().strip().splitlines()
for line in lines:
    course, _, deps = line.partition(":")
    course = course.strip()
    indegree.setdefault(course, 0)
    for dep in deps.split():
        indegree.setdefault(dep, 0)
        prereqs[dep].append(course)
        indegree[course] += 1

ready = [c for c, d in indegree.items() if d == 0]
heapq.heapify(ready)
order = []
semester = {}
for c in ready:
    semester[c] = 1
while ready:
    course = heapq.heappop(ready)
    order.append(course)
    for nxt in prereqs[course]:
        indegree[nxt] -= 1
        semester[nxt] = max(semester.get(nxt, 1), semester[course] + 1)
        if indegree[nxt] == 0:
            heapq.heappush(ready, nxt)

print("order:", " -> ".join(order))
stuck = sorted(c for c, d in indegree.items() if d > 0)
if stuck:
    print("cycle among:", ", ".join(stuck))
plan = defaultdict(list)
for course in order:
    plan[semester[course]].append(course)
for term in sorted(plan):
    print(f"semester {term}: {', '.join(sorted(plan[term]))}")
print("terms needed:", max(plan) if plan else 0)
