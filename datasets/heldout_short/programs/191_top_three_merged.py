from itertools import chain

a = list(map(int, input().split()))
b = list(map(int, input().split()))
print(sorted(chain(a, b), reverse=True)[:3])
