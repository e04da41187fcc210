s = input().strip()
print(sum(int(c) for c in s if c.isdigit()))
