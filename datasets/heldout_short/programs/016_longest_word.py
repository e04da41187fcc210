words = input().split()
longest = ""
for w in words:
    if len(w) > len(longest):
        longest = w
print(longest, len(longest))
