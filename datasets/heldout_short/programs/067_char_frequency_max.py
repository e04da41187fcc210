s = input().strip()
best = max(sorted(set(s)), key=s.count)
print(best, s.count(best))
