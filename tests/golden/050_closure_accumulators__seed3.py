def make_accumulator(name, start=0):
    total = start
    print('__DBG_0__', repr(name) if isinstance(name, (int, float, str, bool, type(None))) else type(name).__name__, repr(start) if isinstance(start, (int, float, str, bool, type(None))) else type(start).__name__, repr(total) if isinstance(total, (int, float, str, bool, type(None))) else type(total).__name__)
    history = []

    def add(amount):
        nonlocal total
        total += amount
        print('__DBG_1__', repr(history) if isinstance(history, (int, float, str, bool, type(None))) else type(history).__name__)
        history.append(amount)
        return total

    def report():
        count = len(history)
        print('__DBG_2__', repr(start) if isinstance(start, (int, float, str, bool, type(None))) else type(start).__name__)
        avg = total / count if count else 0.0
        return f'{name}: total={total} entries={count} avg={avg:.2f}'
    return (add, report)

def make_multiplier(factor):

    def apply(x):
        return x * factor
    return apply
accounts = {}
print('__DBG_3__', repr(accounts) if isinstance(accounts, (int, float, str, bool, type(None))) else type(accounts).__name__)
names_in_order = []
for line in open(0):
    parts = line.split()
    print('__DBG_4__', repr(names_in_order) if isinstance(names_in_order, (int, float, str, bool, type(None))) else type(names_in_order).__name__, repr(line) if isinstance(line, (int, float, str, bool, type(None))) else type(line).__name__, repr(parts) if isinstance(parts, (int, float, str, bool, type(None))) else type(parts).__name__)
    if parts[0] == 'new':
        add, report = make_accumulator(parts[1], int(parts[2]))
        accounts[parts[1]] = (add, report)
        names_in_order.append(parts[1])
    elif parts[0] == 'scale':
        scale = make_multiplier(int(parts[2]))
        print('__DBG_5__', repr(accounts) if isinstance(accounts, (int, float, str, bool, type(None))) else type(accounts).__name__, repr(line) if isinstance(line, (int, float, str, bool, type(None))) else type(line).__name__, repr(scale) if isinstance(scale, (int, float, str, bool, type(None))) else type(scale).__name__)
        add, _ = accounts[parts[1]]
        value = add(scale(int(parts[3])))
        print(f'{parts[1]} += {parts[3]}*{parts[2]} -> {value}')
    else:
        add, _ = accounts[parts[0]]
        value = add(int(parts[1]))
        print(f'{parts[0]} += {parts[1]} -> {value}')
for name in names_in_order:
    print(accounts[name][1]())
