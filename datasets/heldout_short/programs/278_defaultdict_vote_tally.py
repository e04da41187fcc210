from collections import defaultdict

votes = defaultdict(int)
for v in input().split(","):
    votes[v.strip()] += 1
winner = max(sorted(votes), key=votes.get)
print(winner, votes[winner])
print(sorted(votes.items()))
