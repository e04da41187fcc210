s = input().strip()
best_char, best_len = s[0], 1
cur = 1
for i in range(1, len(s)):
    if s[i] == s[i - 1]:
        cur += 1
    else:
        cur = 1
    if cur > best_len:
        best_len = cur
        best_char = s[i]
print(best_char)
print(best_len)
