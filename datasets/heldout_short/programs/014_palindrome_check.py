s = input().strip().lower()
print(s == s[::-1])
