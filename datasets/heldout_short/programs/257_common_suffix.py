a, b = input().split()
n = 0
while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
    n += 1
print(repr(a[len(a) - n:]))
print(n)
