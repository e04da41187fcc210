from collections import deque

d = deque(input().split())
d.rotate(2)
print(list(d))
