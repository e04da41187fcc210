import sys

width = int(sys.stdin.readline())
words = sys.stdin.read().split()


def justify(line_words, width, last=False):
    if last or len(line_words) == 1:
        return " ".join(line_words).ljust(width)
    letters = sum(len(w) for w in line_words)
    gaps = len(line_words) - 1
    spaces, extra = divmod(width - letters, gaps)
    out = ""
    for i, word in enumerate(line_words[:-1]):
        out += word + " " * (spaces + (1 if i < extra else 0))
    return out + line_words[-1]


lines = []
current = []
length = 0
for word in words:
    if current and length + len(current) + len(word) > width:
        lines.append(current)
        current, length = [], 0
    current.append(word)
    length += len(word)
if current:
    lines.append(current)

for i, line_words in enumerate(lines):
    text = justify(line_words, width, last=(i == len(lines) - 1))
    print(f"|{text}|")
print(f"{len(words)} words in {len(lines)} lines of width {width}")
centered = [" ".join(lw).center(width, ".") for lw in lines[:2]]
print("\n".join(centered))
