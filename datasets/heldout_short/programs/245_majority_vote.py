votes = input().split()
candidate, count = None, 0
for v in votes:
    if count == 0:
        candidate = v
    count += 1 if v == candidate else -1
print(candidate)
print(votes.count(candidate), "of", len(votes))
print(votes.count(candidate) > len(votes) // 2)
