s = input()
letters = digits = others = 0
for ch in s:
    if ch.isalpha():
        letters += 1
    elif ch.isdigit():
        digits += 1
    elif not ch.isspace():
        others += 1
print("letters", letters)
print("digits", digits)
print("others", others)
