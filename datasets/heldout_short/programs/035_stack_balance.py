s = input().strip()
depth = 0
ok = True
for ch in s:
    if ch == "(":
        depth += 1
    elif ch == ")":
        depth -= 1
        if depth < 0:
            ok = False
print(ok and depth == 0)
print(depth)
