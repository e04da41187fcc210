stack = []
for ch in input().strip():
    if stack and stack[-1] == ch:
        stack.pop()
    else:
        stack.append(ch)
print("".join(stack) or "empty")
