import sys
PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b,
       "*": lambda a, b: a * b, "/": lambda a, b: a // b}

def tokenize(text):
    tokens = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch.isdigit():
            start = i
            while i < len(text) and text[i].isdigit():
                i += 1
            tokens.append(("NUM", int(text[start:i])))
            continue
        kind = "OP" if ch in "+-*/()" else "BAD"
        tokens.append((kind, ch))
        i += 1
    return tokens

def to_postfix(tokens):
    output, stack = [], []
    for kind, val in tokens:
        if kind == "NUM":
            output.append(val)
        elif val == "(":
            stack.append(val)
        elif val == ")":
            while stack[-1] != "(":
                output.append(stack.pop())
            stack.pop()
        else:
            while stack and stack[-1] != "(" and PREC[stack[-1]] >= PREC[val]:
                output.append(stack.pop())
            stack.append(val)
    return output + stack[::-1]

for line in sys.stdin:
    line = line.strip()
    toks = tokenize(line)
    bad = [v for k, v in toks if k == "BAD"]
    if bad:
        print(f"{line!r}: bad chars {bad}")
        continue
    post = to_postfix(toks)
    values = []
    for item in post:
        if isinstance(item, int):
            values.append(item)
        else:
            b, a = values.pop(), values.pop()
            values.append(OPS[item](a, b))
    print(len(toks), " ".join(map(str, post)), "=", values[0])
