scores = {}
for part in input().split():
    name, s = part.split(":")
    scores[name] = int(s)
print(max(scores, key=scores.get))
