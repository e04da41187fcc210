import sys

lines = [line.strip() for line in sys.stdin if line.strip()]
print("".join(line[0] for line in lines).upper())
print(len(lines), "lines")
