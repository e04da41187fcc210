s = input()
print(repr(s.strip().lower().replace(" ", "_")))
