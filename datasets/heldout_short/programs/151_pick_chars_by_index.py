s = input().strip()
idx = map(int, input().split())
print("".join(s[i] for i in idx))
