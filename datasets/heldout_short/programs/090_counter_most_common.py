from collections import Counter

c = Counter(input().split())
print(c.most_common(1)[0])
