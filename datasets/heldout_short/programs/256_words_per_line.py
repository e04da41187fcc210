import sys

for line in sys.stdin:
    words = line.split()
    print(len(words), words[-1] if words else "-")
