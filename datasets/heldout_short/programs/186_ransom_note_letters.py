from collections import Counter

letters = Counter(input().strip())
note = Counter(input().strip())
short = note - letters
print(not short)
print("".join(sorted(short.elements())))
