program = []
while True:
    try:
        line = input()
    except EOFError:
        break
    parts = line.split()
    if parts:
        program.append(parts)

stack = []
pc = 0
steps = 0
outputs = []
labels = {}
for idx, instr in enumerate(program):
    if instr[0] == "LABEL":
        labels[instr[1]] = idx

while pc < len(program) and steps < 200:
    op, *args = program[pc]
    steps += 1
    pc += 1
    if op == "PUSH":
        stack.append(int(args[0]))
    elif op == "ADD":
        b, a = stack.pop(), stack.pop()
        stack.append(a + b)
    elif op == "SUB":
        b, a = stack.pop(), stack.pop()
        stack.append(a - b)
    elif op == "MUL":
        b, a = stack.pop(), stack.pop()
        stack.append(a * b)
    elif op == "DUP":
        stack.append(stack[-1])
    elif op == "SWAP":
        stack[-1], stack[-2] = stack[-2], stack[-1]
    elif op == "PRINT":
        outputs.append(stack[-1])
        print("out:", stack[-1])
    elif op == "JNZ":
        top = stack.pop()
        if top != 0:
            pc = labels[args[0]]
    elif op == "HALT":
        break

print("steps:", steps)
print("final stack:", stack)
print("outputs sum:", sum(outputs))
