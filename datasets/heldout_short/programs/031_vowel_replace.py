s = input().strip()
out = ""
for ch in s:
    if ch in "aeiou":
        out += "*"
    else:
        out += ch
print(out)
