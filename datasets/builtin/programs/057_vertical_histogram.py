labels = input().split()
values = [int(x) for x in input().split()]
scale = int(input())
heights = []
for v in values:
    h = (v + scale - 1) // scale
    heights.append(h)
top = max(heights)
col_width = max(len(lbl) for lbl in labels) + 1
for level in range(top, 0, -1):
    row = ""
    for h in heights:
        cell = "#" if h >= level else " "
        row += cell.center(col_width)
    print(f"{level * scale:>4} |" + row.rstrip())
print("     +" + "-" * (col_width * len(labels)))
print("      " + "".join(lbl.center(col_width) for lbl in labels).rstrip())
total = sum(values)
running = 0
for lbl, v in zip(labels, values):
    running += v
    pct = v / total * 100
    cum = running / total * 100
    print("%-4s %4d  %5.1f%%  cumulative %5.1f%%" % (lbl, v, pct, cum))
