def make_accumulator(name, start=0):
    total = start
    history = []

    def add(amount):
        nonlocal total
        total += amount
        history.append(amount)
        return total

    def report():
        count = len(history)
        avg = total / count if count else 0.0
        return f"{name}: total={total} entries={count} avg={avg:.2f}"

    return add, report


def make_multiplier(factor):
    def apply(x):
        return x * factor
    return apply


accounts = {}
names_in_order = []
for line in open(0):
    parts = line.split()
    if parts[0] == "new":
        add, report = make_accumulator(parts[1], int(parts[2]))
        accounts[parts[1]] = (add, report)
        names_in_order.append(parts[1])
    elif parts[0] == "scale":
        scale = make_multiplier(int(parts[2]))
        add, _ = accounts[parts[1]]
        value = add(scale(int(parts[3])))
        print(f"{parts[1]} += {parts[3]}*{parts[2]} -> {value}")
    else:
        add, _ = accounts[parts[0]]
        value = add(int(parts[1]))
        print(f"{parts[0]} += {parts[1]} -> {value}")

for name in names_in_order:
    print(accounts[name][1]())
