def digit_square_sum(n):
    total = 0
    while n > 0:
        n, d = divmod(n, 10)
        total += d * d
    return total


def trace(n):
    seen = set()
    chain = [n]
    while n != 1 and n not in seen:
        seen.add(n)
        n = digit_square_sum(n)
        chain.append(n)
    return n == 1, chain


lo, hi = map(int, input().split())
probe = [int(x) for x in input().split()]
happy = []
for n in range(lo, hi + 1):
    ok, _ = trace(n)
    if ok:
        happy.append(n)
print(f"happy numbers in [{lo}, {hi}]: {happy}")
print("count:", len(happy))
for n in probe:
    ok, chain = trace(n)
    label = "happy" if ok else "unhappy"
    shown = " -> ".join(map(str, chain[:9]))
    if len(chain) > 9:
        shown += " -> ..."
    print(f"{n}: {label}, chain length {len(chain)}: {shown}")
loop_members = set(trace(4)[1])
print("unhappy cycle members:", sorted(loop_members))
