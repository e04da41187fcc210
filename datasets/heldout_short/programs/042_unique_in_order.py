s = input().strip()
out = []
for ch in s:
    if not out or out[-1] != ch:
        out.append(ch)
print("".join(out))
