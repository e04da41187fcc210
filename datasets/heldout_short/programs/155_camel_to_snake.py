name = input().strip()
out = []
for ch in name:
    if ch.isupper():
        if out:
            out.append("_")
        out.append(ch.lower())
    else:
        out.append(ch)
print("".join(out))
