moves = []


def hanoi(n, src, dst, via):
    if n == 0:
        return
    hanoi(n - 1, src, via, dst)
    moves.append((n, src, dst))
    hanoi(n - 1, via, dst, src)


disks = int(input())
names = input().split()
hanoi(disks, names[0], names[2], names[1])
pegs = {name: [] for name in names}
pegs[names[0]] = list(range(disks, 0, -1))
for step, (disk, src, dst) in enumerate(moves, 1):
    moved = pegs[src].pop()
    pegs[dst].append(moved)
    if step <= 8 or step == len(moves):
        state = " | ".join(f"{p}:{''.join(map(str, pegs[p])) or '-'}" for p in names)
        print(f"{step:3d}. disk {disk} {src}->{dst}   {state}")
    elif step == 9:
        print("     ...")
print("total moves:", len(moves))
print("expected 2^n - 1 =", 2 ** disks - 1)
per_disk = [0] * (disks + 1)
for disk, _, _ in moves:
    per_disk[disk] += 1
print("moves per disk:", per_disk[1:])
