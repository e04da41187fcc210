word = input().strip()
out = ""
for i, ch in enumerate(word):
    if i % 2 == 0:
        out += ch.upper()
    else:
        out += ch.lower()
print(out)
