import math


def newton_sqrt(x, tolerance=1e-10):
    if x == 0:
        return 0.0, 0
    guess = x / 2 if x > 1 else 1.0
    iterations = 0
    while True:
        better = (guess + x / guess) / 2
        iterations += 1
        if abs(better - guess) < tolerance:
            return better, iterations
        guess = better


def bisect_sqrt(x, tolerance=1e-10):
    lo, hi = 0.0, max(1.0, x)
    rounds = 0
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        rounds += 1
        if mid * mid < x:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2, rounds


values = [float(v) for v in input().split()]
digits = int(input())
print(f"{'x':>10} {'newton':>14} {'bisection':>14} {'iters':>5} {'halvings':>8}")
worst_err = 0.0
for x in values:
    approx, iters = newton_sqrt(x)
    halved, rounds = bisect_sqrt(x)
    err = abs(approx - math.sqrt(x))
    worst_err = max(worst_err, err, abs(halved - math.sqrt(x)))
    print(f"{x:>10.2f} {approx:>14.{digits}f} {halved:>14.{digits}f} {iters:>5} {rounds:>8}")
print("worst error below 1e-9:", worst_err < 1e-9)
total = sum(round(math.sqrt(x), 3) for x in values)
print("sum of roots (3 dp each):", round(total, 3))
