a = input().strip()
b = input().strip()
for ch in sorted(set(b)):
    if b.count(ch) != a.count(ch):
        print(ch, b.index(ch))
