people = [(n, int(a)) for n, a in (p.split(":") for p in input().split())]
people.sort(key=lambda p: p[1])
print(people[0][0], people[-1][0])
