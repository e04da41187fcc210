items = input().split()
prices = [int(x) for x in input().split()]
budget = int(input())
n = len(items)
affordable = []
best_mask = 0
best_total = 0
for mask in range(1 << n):
    total = 0
    for bit in range(n):
        if mask >> bit & 1:
            total += prices[bit]
    if total <= budget:
        affordable.append(mask)
        size = bin(mask).count("1")
        if total > best_total or (total == best_total and size > bin(best_mask).count("1")):
            best_total = total
            best_mask = mask

print(f"{n} items -> {1 << n} subsets, {len(affordable)} within budget {budget}")
chosen = [items[b] for b in range(n) if best_mask >> b & 1]
print(f"best spend {best_total} using mask {best_mask:0{n}b}: {chosen}")
by_size = [0] * (n + 1)
for mask in affordable:
    by_size[bin(mask).count("1")] += 1
for size, cnt in enumerate(by_size):
    print(f"  size {size}: {cnt} affordable subsets")
pairs = [(items[i], items[j]) for i in range(n) for j in range(i + 1, n) if prices[i] + prices[j] == budget]
print("exact-budget pairs:", pairs)
