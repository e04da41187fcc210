import sys

PAIRS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
         (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n):
    if not 0 < n < 4000:
        raise ValueError(f"{n} out of range")
    parts = []
    for value, symbol in PAIRS:
        count, n = divmod(n, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(text):
    total = 0
    prev = 0
    for ch in reversed(text.upper()):
        value = VALUES[ch]
        if value < prev:
            total -= value
        else:
            total += value
            prev = value
    if to_roman(total) != text.upper():
        raise ValueError(f"{text} is not canonical")
    return total


converted = 0
for token in sys.stdin.read().split():
    try:
        if token.isdigit():
            result = to_roman(int(token))
        else:
            result = from_roman(token)
    except KeyError as exc:
        print(f"{token:>10} -> bad symbol {exc}")
    except ValueError as exc:
        print(f"{token:>10} -> error: {exc}")
    else:
        converted += 1
        print(f"{token:>10} -> {result}")
print("converted:", converted)
