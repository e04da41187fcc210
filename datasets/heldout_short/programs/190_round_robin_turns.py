from itertools import cycle, islice

players = input().split()
turns = int(input())
order = list(islice(cycle(players), turns))
print(" ".join(order))
print(order[-1], "plays last")
