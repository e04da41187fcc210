def encode(s):
    if not s:
        return ""
    parts = []
    current = s[0]
    count = 1
    for ch in s[1:]:
        if ch == current:
            count += 1
        else:
            parts.append(f"{count}{current}")
            current = ch
            count = 1
    parts.append(f"{count}{current}")
    return "".join(parts)


def decode(code):
    out = []
    num = 0
    for ch in code:
        if ch.isdigit():
            num = num * 10 + int(ch)
        else:
            out.append(ch * num)
            num = 0
    return "".join(out)


import sys

for line in sys.stdin:
    raw = line.rstrip("\n")
    packed = encode(raw)
    back = decode(packed)
    ratio = len(packed) / len(raw)
    status = "ok" if back == raw else "mismatch"
    print("%-22s => %-18s ratio %.2f %s" % (raw, packed, ratio, status))
