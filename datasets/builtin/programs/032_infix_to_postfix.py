PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 3}
RIGHT_ASSOC = {"^"}


def tokenize(expr):
    tokens = []
    num = ""
    for ch in expr:
        if ch.isdigit():
            num += ch
        else:
            if num:
                tokens.append(num)
                num = ""
            if ch in PREC or ch in "()":
                tokens.append(ch)
    if num:
        tokens.append(num)
    return tokens


def to_postfix(tokens):
    output = []
    ops = []
    for tok in tokens:
        if tok.isdigit():
            output.append(tok)
        elif tok == "(":
            ops.append(tok)
        elif tok == ")":
            while ops[-1] != "(":
                output.append(ops.pop())
            ops.pop()
        else:
            while ops and ops[-1] != "(":
                top = ops[-1]
                if PREC[top] > PREC[tok] or (PREC[top] == PREC[tok] and tok not in RIGHT_ASSOC):
                    output.append(ops.pop())
                else:
                    break
            ops.append(tok)
    while ops:
        output.append(ops.pop())
    return output


n = int(input())
for i in range(n):
    expr = input()
    tokens = tokenize(expr)
    post = to_postfix(tokens)
    print(f"{expr}")
    print(f"   tokens={len(tokens)}  postfix: {' '.join(post)}")
