tokens = input().split()
stack = []
i = 0
while i < len(tokens):
    if tokens[i] == "push":
        stack.append(int(tokens[i + 1]))
        i += 2
    else:
        stack.pop()
        i += 1
print(stack)
