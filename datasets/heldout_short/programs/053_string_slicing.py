s = input().strip()
print(s[2:5], s[-3:], s[::3])
