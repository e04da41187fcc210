s = input().strip()
out = ""
for i, ch in enumerate(s):
    out += chr((ord(ch) - ord("a") + i) % 26 + ord("a"))
print(out)
