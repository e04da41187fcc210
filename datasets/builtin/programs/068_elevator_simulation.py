floors = int(input())
capacity = int(input())
requests = []
for line in iter(input, "."):
    who, src, dst = line.split()
    requests.append((who, int(src), int(dst)))

current = 0
direction = 1
inside = []
waiting = list(requests)
travelled = 0
tick = 0
while waiting or inside:
    leaving = [p for p in inside if p[2] == current]
    for p in leaving:
        inside.remove(p)
        print(f"t={tick:2d} floor {current}: {p[0]} gets out")
    boarding = [p for p in waiting if p[1] == current]
    for p in boarding:
        if len(inside) < capacity:
            waiting.remove(p)
            inside.append(p)
            print(f"t={tick:2d} floor {current}: {p[0]} gets in -> {p[2]}")
    if not waiting and not inside:
        break
    if current == floors - 1:
        direction = -1
    elif current == 0:
        direction = 1
    current += direction
    travelled += 1
    tick += 1
print("floors travelled:", travelled)
print("final floor:", current)
