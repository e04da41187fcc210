from collections import Counter
import sys

text = sys.stdin.read()
letters = [ch.lower() for ch in text if ch.isalpha()]
counts = Counter(letters)
vowels = sum(counts[v] for v in "aeiou")
consonants = len(letters) - vowels
print(f"letters: {len(letters)}, vowels: {vowels}, consonants: {consonants}")
top = counts.most_common()
top.sort(key=lambda kv: (-kv[1], kv[0]))
peak = top[0][1]
for ch, c in top[:8]:
    bar_len = round(20 * c / peak)
    print(f"{ch} {c:3d} {'*' * bar_len}")
missing = [ch for ch in "abcdefghijklmnopqrstuvwxyz" if counts[ch] == 0]
print("missing letters:", "".join(missing) or "none")
digits = sum(ch.isdigit() for ch in text)
spaces = text.count(" ")
print("digits: %d, spaces: %d" % (digits, spaces))
