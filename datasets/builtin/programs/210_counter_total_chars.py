from collections import Counter

c = Counter(input().replace(" ", ""))
print(c["l"], len(c))
