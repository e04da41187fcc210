from collections import deque


def josephus_sim(n, k):
    circle = deque(range(1, n + 1))
    order = []
    while len(circle) > 1:
        circle.rotate(-(k - 1))
        order.append(circle.popleft())
    return order, circle[0]


def josephus_formula(n, k):
    pos = 0
    for size in range(2, n + 1):
        pos = (pos + k) % size
    return pos + 1


cases = []
while True:
    try:
        line = input().strip()
    except EOFError:
        break
    if line:
        n, k = map(int, line.split())
        cases.append((n, k))

for n, k in cases:
    order, survivor = josephus_sim(n, k)
    formula = josephus_formula(n, k)
    preview = order if len(order) <= 10 else order[:10] + ["..."]
    print(f"n={n}, k={k}: eliminated {preview}")
    print(f"   survivor {survivor}, formula says {formula}")
