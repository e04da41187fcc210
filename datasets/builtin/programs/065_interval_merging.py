import sys
from bisect import bisect_right

lines = sys.stdin.read().strip().split("\n")
intervals = []
for line in lines[1:]:
    a, b = line.split("-")
    intervals.append((int(a), int(b)))
query_points = [int(x) for x in lines[0].split()]

by_start = sorted(intervals, key=lambda iv: (iv[0], iv[1]))
merged = []
for start, end in by_start:
    if merged and start <= merged[-1][1]:
        last_start, last_end = merged[-1]
        merged[-1] = (last_start, max(last_end, end))
    else:
        merged.append((start, end))

print("input:", " ".join(f"[{a},{b}]" for a, b in intervals))
print("merged:", " ".join(f"[{a},{b}]" for a, b in merged))
covered = sum(b - a for a, b in merged)
print("total covered length:", covered)
longest = sorted(intervals, key=lambda iv: iv[1] - iv[0], reverse=True)
print("longest original:", longest[0], "length", longest[0][1] - longest[0][0])

top = max(b for _, b in intervals) + 2
diff = [0] * top
for a, b in intervals:
    diff[a] += 1
    diff[b + 1] -= 1
depth = []
running = 0
for d in diff:
    running += d
    depth.append(running)
starts = [a for a, _ in merged]
for p in query_points:
    block = bisect_right(starts, p) - 1
    inside = block >= 0 and p <= merged[block][1]
    where = f"merged block {block}" if inside else "a gap"
    print(f"point {p:2d}: covered by {depth[p]} intervals, in {where}")
