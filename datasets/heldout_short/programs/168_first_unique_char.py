from collections import Counter

s = input().strip()
counts = Counter(s)
for i, ch in enumerate(s):
    if counts[ch] == 1:
        print(ch)
        print(i)
        break
else:
    print("none")
