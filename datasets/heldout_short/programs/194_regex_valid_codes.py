import re

codes = input().split()
valid = [c for c in codes if re.fullmatch(r"[A-Z]{2}\d{3}", c)]
print(valid)
