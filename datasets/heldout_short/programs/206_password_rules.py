pw = input().strip()
has_digit = any(c.isdigit() for c in pw)
has_upper = any(c.isupper() for c in pw)
long_enough = len(pw) >= 8
print("digit:", has_digit)
print("upper:", has_upper)
print("valid" if has_digit and has_upper and long_enough else "invalid")
