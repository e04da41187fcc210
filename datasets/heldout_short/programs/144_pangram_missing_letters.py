import string

text = input().lower()
missing = [c for c in string.ascii_lowercase if c not in text]
print(len(missing) == 0)
print("".join(missing))
