import math


class StackUnderflow(Exception):
    pass


def pop(stack, n):
    if len(stack) < n:
        raise StackUnderflow(f"need {n}, have {len(stack)}")
    items = stack[-n:]
    del stack[-n:]
    return items


BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "^": lambda a, b: a ** b,
}
UNARY = {"sqrt": math.sqrt, "neg": lambda a: -a, "abs": abs}

n = int(input())
for lineno in range(1, n + 1):
    expr = input()
    stack = []
    try:
        for tok in expr.split():
            if tok in BINARY:
                a, b = pop(stack, 2)
                stack.append(BINARY[tok](a, b))
            elif tok in UNARY:
                (a,) = pop(stack, 1)
                stack.append(UNARY[tok](a))
            elif tok == "dup":
                (a,) = pop(stack, 1)
                stack.extend([a, a])
            else:
                stack.append(float(tok))
        if len(stack) != 1:
            raise ValueError(f"{len(stack)} values left")
    except StackUnderflow as exc:
        print(f"{lineno}: underflow ({exc})")
    except ZeroDivisionError:
        print(f"{lineno}: divide by zero")
    except ValueError as exc:
        print(f"{lineno}: bad input ({exc})")
    else:
        result = stack[0]
        shown = int(result) if result == int(result) else round(result, 4)
        print(f"{lineno}: {expr} => {shown}")
