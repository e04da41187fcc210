import sys

moves = []


def hanoi(n, source, target, spare, pegs):
    if n == 0:
        return
    hanoi(n - 1, source, spare, target, pegs)
    disk = pegs[source].pop()
    pegs[target].append(disk)
    moves.append((disk, source, target))
    hanoi(n - 1, spare, target, source, pegs)


for token in sys.stdin.read().split():
    disks = int(token)
    moves = []
    pegs = {"A": list(range(disks, 0, -1)), "B": [], "C": []}
    hanoi(disks, "A", "C", "B", pegs)
    print(f"{disks} disks -> {len(moves)} moves (expected {2 ** disks - 1})")
    if disks <= 3:
        for step, (disk, src, dst) in enumerate(moves, 1):
            print(f"  {step}: disk {disk} {src}->{dst}")
    counts = {}
    for disk, _, _ in moves:
        counts[disk] = counts.get(disk, 0) + 1
    summary = ", ".join(f"d{d}x{c}" for d, c in sorted(counts.items()))
    print("  per disk:", summary)
    print("  final C:", pegs["C"])
