def luhn_total(number):
    total = 0
    for pos, ch in enumerate(reversed(number)):
        digit = int(ch)
        if pos % 2 == 1:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total


def check_digit(partial):
    for d in range(10):
        if luhn_total(partial + str(d)) % 10 == 0:
            return d
    return -1


count = int(input())
valid = 0
for _ in range(count):
    raw = input().strip()
    digits = raw.replace(" ", "").replace("-", "")
    if not digits.isdigit():
        print(f"{raw:<22} not a number")
        continue
    total = luhn_total(digits)
    ok = total % 10 == 0
    if ok:
        valid += 1
        print(f"{raw:<22} valid   (sum {total})")
    else:
        fix = check_digit(digits[:-1])
        print(f"{raw:<22} INVALID (sum {total}, last digit should be {fix})")
print(f"{valid} valid out of {count}")
