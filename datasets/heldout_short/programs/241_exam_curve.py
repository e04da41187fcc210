scores = list(map(int, input().split()))
bump = 100 - max(scores)
curved = [s + bump for s in scores]
print(bump)
print(curved)
print(sum(curved) / len(curved))
