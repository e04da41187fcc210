import sys


def read_lines(stream):
    for line in stream:
        yield line.rstrip("\n")


def non_comments(lines):
    for line in lines:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield stripped


def parse(lines):
    for line in lines:
        user, action, amount = line.split(",")
        yield user, action, int(amount)


def running_balance(events):
    balances = {}
    for user, action, amount in events:
        delta = amount if action == "credit" else -amount
        balances[user] = balances.get(user, 0) + delta
        yield user, action, amount, balances[user]


def flag_negative(rows):
    for row in rows:
        marker = "  <-- overdrawn" if row[3] < 0 else ""
        yield row, marker


pipeline = flag_negative(running_balance(parse(non_comments(read_lines(sys.stdin)))))
count = 0
overdrawn = []
for (user, action, amount, balance), marker in pipeline:
    count += 1
    print(f"{count:>2} {user:<5} {action:<6} {amount:>5} bal={balance:>5}{marker}")
    if marker:
        overdrawn.append(user)

squares = (n * n for n in range(1, 11))
even_squares = sum(sq for sq in squares if sq % 2 == 0)
print("events:", count, "overdrawn:", overdrawn)
print("sum of even squares 1..10:", even_squares)
