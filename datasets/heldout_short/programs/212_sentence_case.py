s = input().strip().lower()
print(s[0].upper() + s[1:] + ("" if s.endswith(".") else "."))
