import sys
from collections import defaultdict

by_level = defaultdict(list)
by_module = defaultdict(int)
order = ["DEBUG", "INFO", "WARN", "ERROR"]
malformed = 0

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    try:
        stamp, level, rest = line.split(" ", 2)
        module, message = rest.split(": ", 1)
    except ValueError:
        malformed += 1
        continue
    if level not in order:
        malformed += 1
        continue
    by_level[level].append((stamp, module, message))
    by_module[module] += 1

for level in order:
    entries = by_level.get(level, [])
    print(f"{level:<5} x{len(entries)}")
    if order.index(level) >= 2:
        for stamp, module, message in entries:
            print(f"    {stamp} [{module}] {message}")
busiest = sorted(by_module.items(), key=lambda kv: (-kv[1], kv[0]))
print("modules:", ", ".join(f"{m}={n}" for m, n in busiest))
print("malformed lines:", malformed)
first_error = by_level["ERROR"][0][0] if by_level["ERROR"] else "none"
print("first error at:", first_error)
