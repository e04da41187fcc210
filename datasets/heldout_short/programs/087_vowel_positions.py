s = input().strip()
print([i for i, c in enumerate(s) if c in "aeiou"])
