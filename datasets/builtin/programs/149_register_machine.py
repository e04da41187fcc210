class Trace:
    def __init__(self, cpu, label):
        self.cpu = cpu
        self.label = label

    def __enter__(self):
        self.before = dict(self.cpu.regs)
        self.cpu.executed = 0
        return self.cpu

    def __exit__(self, exc_type, exc, tb):
        changed = [f"{r}:{self.before[r]}->{v}" for r, v in self.cpu.regs.items() if self.before[r] != v]
        print(f"[{self.label}] {self.cpu.executed} instr, changed {' '.join(changed) or 'nothing'}")
        return False


class CPU:
    def __init__(self):
        self.regs = {"a": 0, "b": 0, "c": 0, "d": 0}
        self.executed = 0

    def value(self, operand):
        return self.regs[operand] if operand in self.regs else int(operand)

    def run(self, program):
        pc = 0
        while 0 <= pc < len(program):
            op, *args = program[pc].split()
            self.executed += 1
            if op == "cpy":
                self.regs[args[1]] = self.value(args[0])
            elif op == "inc":
                self.regs[args[0]] += 1
            elif op == "dec":
                self.regs[args[0]] -= 1
            elif op == "jnz" and self.value(args[0]) != 0:
                pc += self.value(args[1])
                continue
            pc += 1


blocks = open(0).read().strip().split("\n\n")
cpu = CPU()
for number, block in enumerate(blocks, 1):
    program = block.splitlines()
    with Trace(cpu, f"prog{number}") as machine:
        machine.run(program)
print("final registers:", " ".join(f"{r}={v}" for r, v in cpu.regs.items()))
