width = int(input())
lines = []
current = ""
for w in input().split():
    if current and len(current) + 1 + len(w) > width:
        lines.append(current)
        current = w
    else:
        current = current + " " + w if current else w
lines.append(current)
for line in lines:
    print(line)
