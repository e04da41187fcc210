from collections import deque

recent = deque(maxlen=3)
for page in input().split():
    recent.append(page)
print(list(recent))
print(recent[0])
