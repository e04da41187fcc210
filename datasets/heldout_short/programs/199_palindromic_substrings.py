s = input().strip()
count = 0
longest = ""
for i in range(len(s)):
    for j in range(i + 1, len(s) + 1):
        sub = s[i:j]
        if sub == sub[::-1]:
            count += 1
            if len(sub) > len(longest):
                longest = sub
print(count)
print(longest)
