s = input().strip()
print(s.upper())
print(s.lower())
print(s.title())
