rows = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]
words = input().split()
print([w for w in words if any(set(w.lower()) <= set(r) for r in rows)])
