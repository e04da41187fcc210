from bisect import bisect_right, bisect_left, insort

cutoffs = [60, 70, 80, 90]
letters = "FDCBA"


def grade(score):
    return letters[bisect_right(cutoffs, score)]


names = input().split()
scores = list(map(int, input().split()))
ranked = []
for name, score in zip(names, scores):
    insort(ranked, (score, name))
    print(f"{name:<6} {score:>3} {grade(score)}")

ordered = [s for s, _ in ranked]
print("sorted scores:", ordered)
queries = list(map(int, input().split()))
for q in queries:
    below = bisect_left(ordered, q)
    at_most = bisect_right(ordered, q)
    print(f"score {q}: {below} below, {at_most - below} equal, {len(ordered) - at_most} above")

median_index = len(ordered) // 2
if len(ordered) % 2:
    median = ordered[median_index]
else:
    median = (ordered[median_index - 1] + ordered[median_index]) / 2
print("median:", median, "top:", ranked[-1][1])
