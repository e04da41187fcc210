import sys

table = {}


def team(name):
    if name not in table:
        table[name] = {"P": 0, "W": 0, "D": 0, "L": 0, "GF": 0, "GA": 0, "Pts": 0}
    return table[name]


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    left, right = line.split(" - ")
    home, hg = left.rsplit(" ", 1)
    away, ag = right.split(" ", 1)[1], right.split(" ", 1)[0]
    hg, ag = int(hg), int(ag)
    h, a = team(home), team(away)
    h["P"] += 1
    a["P"] += 1
    h["GF"] += hg
    h["GA"] += ag
    a["GF"] += ag
    a["GA"] += hg
    if hg > ag:
        h["W"] += 1
        a["L"] += 1
        h["Pts"] += 3
    elif hg < ag:
        a["W"] += 1
        h["L"] += 1
        a["Pts"] += 3
    else:
        h["D"] += 1
        a["D"] += 1
        h["Pts"] += 1
        a["Pts"] += 1

ranking = sorted(table.items(),
                 key=lambda kv: (-kv[1]["Pts"], -(kv[1]["GF"] - kv[1]["GA"]), -kv[1]["GF"], kv[0]))
print(f"{'#':>2} {'Team':<10} P  W  D  L  GD Pts")
for pos, (name, s) in enumerate(ranking, start=1):
    gd = s["GF"] - s["GA"]
    print(f"{pos:>2} {name:<10} {s['P']}  {s['W']}  {s['D']}  {s['L']} {gd:+3d} {s['Pts']:>3}")
