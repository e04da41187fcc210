VALUES = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
    (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
    (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
SINGLE = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n):
    out = ""
    for value, sym in VALUES:
        while n >= value:
            out += sym
            n -= value
    return out


def from_roman(s):
    total = 0
    prev = 0
    for ch in reversed(s):
        val = SINGLE[ch]
        if val < prev:
            total -= val
        else:
            total += val
            prev = val
    return total


tokens = open(0).read().split()
for tok in tokens:
    if tok.isdigit():
        num = int(tok)
        roman = to_roman(num)
        print(f"{num:>5} -> {roman}")
    else:
        num = from_roman(tok)
        check = to_roman(num)
        flag = "" if check == tok else f"  (canonical {check})"
        print(f"{tok:>9} -> {num}{flag}")
