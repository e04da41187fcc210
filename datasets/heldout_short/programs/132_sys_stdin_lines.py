import sys

lines = [line.strip() for line in sys.stdin if line.strip()]
print(len(lines), max(lines, key=len))
