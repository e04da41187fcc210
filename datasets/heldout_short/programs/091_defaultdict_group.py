from collections import defaultdict

groups = defaultdict(list)
for w in input().split():
    groups[w[0]].append(w)
print(dict(groups))
