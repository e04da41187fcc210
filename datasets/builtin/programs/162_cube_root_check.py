n = int(input())
r = round(n ** (1 / 3))
print(r if r ** 3 == n else "not a cube")
