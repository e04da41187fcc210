def shift_char(ch, k):
    if ch.isupper():
        base = ord("A")
    elif ch.islower():
        base = ord("a")
    else:
        return ch
    offset = (ord(ch) - base + k) % 26
    return chr(base + offset)


def caesar(text, k):
    out = []
    for ch in text:
        out.append(shift_char(ch, k))
    return "".join(out)


key = int(input())
lines = []
while True:
    try:
        line = input()
    except EOFError:
        break
    lines.append(line)

for line in lines:
    enc = caesar(line, key)
    dec = caesar(enc, -key)
    print(f"plain : {line}")
    print(f"cipher: {enc}")
    print("roundtrip ok" if dec == line else "roundtrip FAILED")
letters = sum(ch.isalpha() for line in lines for ch in line)
print(f"{letters} letters shifted by {key}")
