s = input()
print([ord(c) for c in s])
print(chr(sum(ord(c) for c in s) % 26 + 65))
