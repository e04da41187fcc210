import heapq
import sys

values = [float(tok) for tok in sys.stdin.read().split()]
window = int(values[0])
stream = values[1:]
low = []
high = []
recent = []
window_sum = 0.0
print(f"{'#':>2} {'value':>7} {'median':>8} {'mov.avg':>8}")
for i, v in enumerate(stream, 1):
    if not low or v <= -low[0]:
        heapq.heappush(low, -v)
    else:
        heapq.heappush(high, v)
    if len(low) > len(high) + 1:
        heapq.heappush(high, -heapq.heappop(low))
    elif len(high) > len(low):
        heapq.heappush(low, -heapq.heappop(high))
    if len(low) > len(high):
        median = -low[0]
    else:
        median = (-low[0] + high[0]) / 2
    recent.append(v)
    window_sum += v
    if len(recent) > window:
        window_sum -= recent.pop(0)
    avg = window_sum / len(recent)
    print(f"{i:>2} {v:>7.2f} {median:>8.2f} {avg:>8.3f}")
overall = sum(stream) / len(stream)
print("overall mean:", round(overall, 4))
print("final median:", median)
