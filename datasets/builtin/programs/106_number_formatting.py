values = [int(tok) for tok in input().split()]
prices = [float(tok) for tok in input().split()]

print(f"{'dec':>6} {'hex':>6} {'oct':>6} {'bin':>12}")
for v in values:
    print(f"{v:>6} {v:>#6x} {v:>#6o} {v:>12b}")

print()
total = 0.0
for i, p in enumerate(prices, 1):
    total += p
    bar = "#" * len(str(int(p)))
    print(f"item{i:02d} {p:>10,.2f} {bar}")
print(f"{'total':<6} {total:>10,.2f}")
avg = total / len(prices)
print(f"{'avg':<6} {avg:>10.3f}")
print(f"share of first: {prices[0] / total:.1%}")
big = values[-1] ** 3
print(f"cube of last: {big:,} / {big:_x} / {big:e}")
print(f"[{'left':<10}][{'mid':^10}][{'right':>10}]")
signed = [v - 50 for v in values]
print(" ".join(f"{s:+d}" for s in signed))
