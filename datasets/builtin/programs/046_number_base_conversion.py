DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def to_base(n, base):
    if n == 0:
        return "0"
    negative = n < 0
    n = abs(n)
    out = []
    while n > 0:
        n, rem = divmod(n, base)
        out.append(DIGITS[rem])
    if negative:
        out.append("-")
    return "".join(reversed(out))


def from_base(text, base):
    value = 0
    for ch in text.upper():
        value = value * base + DIGITS.index(ch)
    return value


import sys

numbers = []
requests = []
for line in sys.stdin:
    parts = line.split()
    if len(parts) == 1:
        numbers.append(int(parts[0]))
    elif len(parts) == 2:
        requests.append((parts[0], int(parts[1])))

print("{:>8} {:>12} {:>6} {:>5} {:>6}".format("dec", "bin", "oct", "hex", "b36"))
for n in numbers:
    print("{:>8} {:>12} {:>6} {:>5} {:>6}".format(n, to_base(n, 2), to_base(n, 8), to_base(n, 16), to_base(n, 36)))
for text, base in requests:
    value = from_base(text, base)
    print(f"{text} in base {base} = {value} (hex {value:X})")
