import sys
from functools import reduce
from collections import Counter

text = sys.stdin.read()
words = [w.strip(".,;:!?").lower() for w in text.split()]
words = [w for w in words if w]
lengths = Counter(len(w) for w in words)
longest = max(lengths)
tallest = max(lengths.values())

for level in range(tallest, 0, -1):
    row = ""
    for size in range(1, longest + 1):
        row += " # " if lengths.get(size, 0) >= level else "   "
    print(f"{level:>2} |{row.rstrip()}")
print("   +" + "---" * longest)
print(("    " + "".join(f"{n:^3}" for n in range(1, longest + 1))).rstrip())

vowels = reduce(lambda acc, w: acc + sum(ch in "aeiou" for ch in w), words, 0)
letters = sum(map(len, words))
print(f"words={len(words)} letters={letters} vowels={vowels} ({vowels / letters:.1%})")
mode_length, mode_count = max(lengths.items(), key=lambda kv: (kv[1], -kv[0]))
print(f"most common length: {mode_length} ({mode_count} words)")
long_words = sorted({w for w in words if len(w) == longest})
print("longest words:", long_words)
