def evaluate(tokens):
    stack = []
    max_depth = 0
    for tok in tokens:
        if tok in "+-*/%":
            right = stack.pop()
            left = stack.pop()
            if tok == "+":
                result = left + right
            elif tok == "-":
                result = left - right
            elif tok == "*":
                result = left * right
            elif tok == "/":
                result = left // right
            else:
                result = left % right
            stack.append(result)
        else:
            stack.append(int(tok))
        max_depth = max(max_depth, len(stack))
    if len(stack) != 1:
        raise ValueError("malformed")
    return stack[0], max_depth


total = 0
lines = open(0).read().strip().split("\n")
for number, line in enumerate(lines, 1):
    tokens = line.split()
    try:
        value, depth = evaluate(tokens)
    except (ValueError, IndexError):
        print(f"expr {number}: malformed -> {line}")
        continue
    total += value
    print(f"expr {number}: {line:<24} = {value:>6}   (stack depth {depth})")
print("sum of valid results:", total)
