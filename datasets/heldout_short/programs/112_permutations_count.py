from itertools import permutations

s = input().strip()
perms = sorted("".join(p) for p in permutations(s))
print(len(perms))
print(perms[0], perms[-1])
