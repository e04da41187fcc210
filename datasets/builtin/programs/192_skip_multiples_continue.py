n = int(input())
kept = []
for i in range(1, n + 1):
    if i % 4 == 0:
        continue
    kept.append(i)
print(len(kept), kept[-1])
