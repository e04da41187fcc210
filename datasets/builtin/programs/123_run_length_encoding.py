from itertools import groupby


def encode(text):
    out = []
    for ch, group in groupby(text):
        n = len(list(group))
        out.append(f"{n}{ch}" if n > 1 else ch)
    return "".join(out)


def decode(code):
    result = []
    count = ""
    for ch in code:
        if ch.isdigit():
            count += ch
        else:
            result.append(ch * int(count or "1"))
            count = ""
    return "".join(result)


total_in = 0
total_out = 0
while True:
    try:
        line = input()
    except EOFError:
        break
    if line.startswith("!"):
        print(f"decode {line[1:]!r} -> {decode(line[1:])!r}")
        continue
    packed = encode(line)
    total_in += len(line)
    total_out += len(packed)
    assert decode(packed) == line
    ratio = len(packed) / len(line)
    print(f"{line!r:<22} -> {packed!r:<16} {ratio:.2f}")
print(f"overall: {total_in} -> {total_out} chars ({total_out / total_in:.1%})")
