import sys


def wrap(words, width):
    lines = []
    current = []
    length = 0
    for word in words:
        if current and length + 1 + len(word) > width:
            lines.append(current)
            current = [word]
            length = len(word)
        else:
            length += len(word) + (1 if current else 0)
            current.append(word)
    if current:
        lines.append(current)
    return lines


def justify(line_words, width):
    if len(line_words) == 1:
        return line_words[0].ljust(width)
    gaps = len(line_words) - 1
    spaces = width - sum(len(w) for w in line_words)
    base, extra = divmod(spaces, gaps)
    out = ""
    for i, word in enumerate(line_words[:-1]):
        out += word + " " * (base + (1 if i < extra else 0))
    return out + line_words[-1]


width = int(sys.stdin.readline())
words = sys.stdin.read().split()
lines = wrap(words, width)
print("+" + "-" * width + "+")
for i, lw in enumerate(lines):
    if i == len(lines) - 1:
        text = " ".join(lw).ljust(width)
    else:
        text = justify(lw, width)
    print("|" + text + "|")
print("+" + "-" * width + "+")
print(f"{len(words)} words in {len(lines)} lines of width {width}")
