import sys

def read_lines(stream):
    for line in stream:
        yield line.rstrip('\n')

def non_comments(lines):
    for line in lines:
        stripped = line.strip()
        if stripped and (not stripped.startswith('#')):
            yield stripped
        print('__DBG_0__', repr(lines) if isinstance(lines, (int, float, str, bool, type(None))) else type(lines).__name__, repr(stripped) if isinstance(stripped, (int, float, str, bool, type(None))) else type(stripped).__name__)

def parse(lines):
    for line in lines:
        user, action, amount = line.split(',')
        print('__DBG_1__', repr(amount) if isinstance(amount, (int, float, str, bool, type(None))) else type(amount).__name__)
        yield (user, action, int(amount))

def running_balance(events):
    balances = {}
    print('__DBG_2__', repr(events) if isinstance(events, (int, float, str, bool, type(None))) else type(events).__name__, repr(balances) if isinstance(balances, (int, float, str, bool, type(None))) else type(balances).__name__)
    for user, action, amount in events:
        delta = amount if action == 'credit' else -amount
        print('__DBG_3__', repr(amount) if isinstance(amount, (int, float, str, bool, type(None))) else type(amount).__name__)
        balances[user] = balances.get(user, 0) + delta
        yield (user, action, amount, balances[user])

def flag_negative(rows):
    for row in rows:
        marker = '  <-- overdrawn' if row[3] < 0 else ''
        print('__DBG_4__', repr(marker) if isinstance(marker, (int, float, str, bool, type(None))) else type(marker).__name__, repr(row) if isinstance(row, (int, float, str, bool, type(None))) else type(row).__name__, repr(rows) if isinstance(rows, (int, float, str, bool, type(None))) else type(rows).__name__)
        yield (row, marker)
pipeline = flag_negative(running_balance(parse(non_comments(read_lines(sys.stdin)))))
print('__DBG_5__', repr(pipeline) if isinstance(pipeline, (int, float, str, bool, type(None))) else type(pipeline).__name__)
count = 0
overdrawn = []
for (user, action, amount, balance), marker in pipeline:
    count += 1
    print(f'{count:>2} {user:<5} {action:<6} {amount:>5} bal={balance:>5}{marker}')
    if marker:
        overdrawn.append(user)
squares = (n * n for n in range(1, 11))
even_squares = sum((sq for sq in squares if sq % 2 == 0))
print('events:', count, 'overdrawn:', overdrawn)
print('sum of even squares 1..10:', even_squares)
