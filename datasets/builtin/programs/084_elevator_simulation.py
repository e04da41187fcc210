import sys

data = sys.stdin.read().split()
floors = int(data[0])
start = int(data[1])
requests = [int(x) for x in data[2:]]

current = start
direction = 1
pending = sorted(set(r for r in requests if 0 <= r < floors))
travelled = 0
log = []

while pending:
    ahead = [f for f in pending if (f - current) * direction >= 0]
    if not ahead:
        direction = -direction
        log.append(f"reverse at {current}")
        continue
    target = min(ahead, key=lambda f: abs(f - current))
    distance = abs(target - current)
    travelled += distance
    current = target
    pending.remove(target)
    arrow = "up" if direction > 0 else "down"
    log.append(f"stop {current:2d} ({arrow}, moved {distance})")

for entry in log:
    print(entry)
ignored = [r for r in requests if not 0 <= r < floors]
print("total distance:", travelled)
print("ignored:", ignored)
