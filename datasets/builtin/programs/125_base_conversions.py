DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def to_base(n, base):
    if n == 0:
        return "0"
    sign = "-" if n < 0 else ""
    n = abs(n)
    digits = []
    while n:
        n, r = divmod(n, base)
        digits.append(DIGITS[r])
    return sign + "".join(reversed(digits))


def from_base(text, base):
    value = 0
    for ch in text.upper():
        d = DIGITS.index(ch)
        if d >= base:
            raise ValueError(f"digit {ch} invalid in base {base}")
        value = value * base + d
    return value


count = int(input())
for _ in range(count):
    text, src, dst = input().split()
    src, dst = int(src), int(dst)
    try:
        value = from_base(text, src)
    except ValueError as err:
        print(f"{text} (base {src}): {err}")
        continue
    converted = to_base(value, dst)
    print(f"{text} (base {src}) = {value} = {converted} (base {dst})")
    print(f"    builtins: {bin(value)} {oct(value)} {hex(value)} popcount={bin(value).count('1')}")

n = int(input())
print(f"{n} in bases 2..16: " + " ".join(to_base(n, b) for b in (2, 3, 5, 7, 12, 16)))
print(f"two's complement 8-bit of -{n}: {(-n) & 0xFF:08b}")
