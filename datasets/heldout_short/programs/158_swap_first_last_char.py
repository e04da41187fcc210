s = input().strip()
if len(s) < 2:
    print(s)
else:
    print(s[-1] + s[1:-1] + s[0])
