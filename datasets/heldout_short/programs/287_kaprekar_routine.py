n = int(input())
while n != 6174:
    digits = sorted(str(n).zfill(4))
    n = int("".join(reversed(digits))) - int("".join(digits))
    print(n)
