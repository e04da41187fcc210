s = input().strip()
mid = len(s) // 2
print(s[:mid])
print(s[mid:])
