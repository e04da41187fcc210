n = int(input())
g = n ^ (n >> 1)
print(g)
print(format(g, "b"))
