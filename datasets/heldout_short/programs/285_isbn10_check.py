isbn = input().strip().replace("-", "")
total = 0
for i, ch in enumerate(isbn):
    value = 10 if ch == "X" else int(ch)
    total += value * (10 - i)
print(total)
print("valid" if total % 11 == 0 else "invalid")
