scores = list(map(int, input().split()))
order = sorted(scores, reverse=True)
print([order.index(s) + 1 for s in scores])
