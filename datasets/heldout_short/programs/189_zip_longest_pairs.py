from itertools import zip_longest

a = input().split()
b = input().split()
print(["-".join(p) for p in zip_longest(a, b, fillvalue="?")])
