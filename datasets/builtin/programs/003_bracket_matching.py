PAIRS = {")": "(", "]": "[", "}": "{"}


def check(expr):
    stack = []
    for pos, ch in enumerate(expr):
        if ch in "([{":
            stack.append((ch, pos))
        elif ch in PAIRS:
            if not stack:
                return False, pos
            top, where = stack.pop()
            if top != PAIRS[ch]:
                return False, pos
    if stack:
        leftover = stack[-1][1]
        return False, leftover
    return True, -1


n = int(input())
balanced = 0
for i in range(n):
    expr = input().strip()
    ok, pos = check(expr)
    if ok:
        balanced += 1
        print(f"{expr!r}: balanced")
    else:
        print(f"{expr!r}: error at index {pos}")
print(f"{balanced}/{n} balanced")
