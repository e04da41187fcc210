from collections import defaultdict

words = open(0).read().split()
groups = defaultdict(list)
for word in words:
    key = "".join(sorted(word.lower()))
    groups[key].append(word.lower())

multi = []
singles = []
for key, members in groups.items():
    unique = sorted(set(members))
    if len(unique) > 1:
        multi.append(unique)
    else:
        singles.append(unique[0])

multi.sort(key=lambda g: (-len(g), g[0]))
for i, group in enumerate(multi, 1):
    print(f"group {i} ({len(group)}): {', '.join(group)}")
print("no anagram partner:", " ".join(sorted(singles)))

by_length = defaultdict(list)
for word in set(w.lower() for w in words):
    by_length[len(word)].append(word)
for length in sorted(by_length):
    bucket = sorted(by_length[length])
    print(f"len {length}: {bucket}")
