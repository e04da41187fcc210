from collections import defaultdict

n = int(input())
words = []
while len(words) < n:
    words.extend(input().split())

groups = defaultdict(list)
for word in words:
    key = "".join(sorted(word.lower()))
    groups[key].append(word)

result = []
for key, members in groups.items():
    members = sorted(set(members))
    result.append(members)
result.sort(key=lambda g: (-len(g), g[0]))

group_no = 0
for members in result:
    if len(members) < 2:
        continue
    group_no += 1
    print(f"group {group_no}: {' '.join(members)}")
singles = sorted(m[0] for m in result if len(m) == 1)
print("no anagram partner:", ", ".join(singles))
print("largest group size:", len(result[0]))
