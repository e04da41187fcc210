import sys


def shift_char(ch, k, direction):
    if ch.isupper():
        base = ord("A")
    elif ch.islower():
        base = ord("a")
    else:
        return ch
    return chr((ord(ch) - base + direction * k) % 26 + base)


def vigenere(text, key, direction=1):
    out = []
    idx = 0
    for ch in text:
        if ch.isalpha():
            k = ord(key[idx % len(key)].lower()) - ord("a")
            out.append(shift_char(ch, k, direction))
            idx += 1
        else:
            out.append(ch)
    return "".join(out)


key = sys.stdin.readline().strip()
messages = [line.rstrip("\n") for line in sys.stdin]
for msg in messages:
    enc = vigenere(msg, key)
    dec = vigenere(enc, key, -1)
    print(f"plain : {msg}")
    print(f"cipher: {enc}")
    print(f"check : {'ok' if dec == msg else 'MISMATCH'}")

letters = [ch for ch in vigenere(" ".join(messages), key).lower() if ch.isalpha()]
freq = {}
for ch in letters:
    freq[ch] = freq.get(ch, 0) + 1
top = sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
print("top cipher letters:", " ".join(f"{c}:{n}" for c, n in top))
