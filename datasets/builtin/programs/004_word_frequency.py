import sys
from collections import Counter

text = sys.stdin.read().lower()
cleaned = ""
for ch in text:
    if ch.isalpha() or ch.isspace():
        cleaned += ch
    else:
        cleaned += " "
words = cleaned.split()
counts = Counter(words)
total = len(words)
unique = len(counts)
ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
print(f"total words: {total}")
print(f"unique words: {unique}")
for word, c in ranked[:6]:
    share = 100.0 * c / total
    bar = "#" * c
    print(f"{word:<8}{c:>3} {share:5.1f}% {bar}")
longest = max(words, key=lambda w: (len(w), w))
print("longest word:", longest)
