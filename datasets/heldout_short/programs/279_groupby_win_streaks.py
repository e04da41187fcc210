from itertools import groupby

results = input().strip()
streaks = [(k, len(list(g))) for k, g in groupby(results)]
print(streaks)
print("longest W", max(n for k, n in streaks if k == "W"))
print("longest L", max(n for k, n in streaks if k == "L"))
