for _ in range(3):
    a, op, b = input().split()
    a, b = float(a), float(b)
    if op == "+":
        print(a + b)
    elif op == "-":
        print(a - b)
    elif op == "*":
        print(a * b)
    else:
        print(a / b if b else "undefined")
