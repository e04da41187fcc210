s = input().strip()
digits = "".join(c for c in s if c.isdigit())
letters = "".join(c for c in s if c.isalpha())
print(digits, letters)
