import heapq
import sys


def to_minutes(text):
    h, m = map(int, text.split(":"))
    return h * 60 + m


def fmt(minutes):
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


meetings = []
for line in sys.stdin:
    title, start, end = line.split()
    meetings.append((to_minutes(start), to_minutes(end), title))
meetings.sort()

merged = []
for start, end, title in meetings:
    if merged and start <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], end)
        merged[-1][2].append(title)
    else:
        merged.append([start, end, [title]])

print("busy blocks:")
busy = 0
for start, end, titles in merged:
    busy += end - start
    print(f"  {fmt(start)}-{fmt(end)} {'+'.join(titles)}")
print("free gaps:")
for (_, end_a, _), (start_b, _, _) in zip(merged, merged[1:]):
    print(f"  {fmt(end_a)}-{fmt(start_b)} ({start_b - end_a} min)")

rooms = []
peak = 0
for start, end, title in meetings:
    if rooms and rooms[0] <= start:
        heapq.heapreplace(rooms, end)
    else:
        heapq.heappush(rooms, end)
    peak = max(peak, len(rooms))
print(f"busy minutes: {busy}, rooms needed: {peak}")
