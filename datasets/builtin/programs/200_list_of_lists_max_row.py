rows = [list(map(int, r.split())) for r in input().split(";")]
best = max(rows, key=sum)
print(best, sum(best))
