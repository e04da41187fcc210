k = int(input())
text = input()
out = []
for ch in text:
    if ch.isalpha():
        out.append(chr((ord(ch) - 97 + k) % 26 + 97))
    else:
        out.append(ch)
print("".join(out))
