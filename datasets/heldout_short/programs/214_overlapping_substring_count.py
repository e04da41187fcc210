text = input().strip()
pat = input().strip()
overlap = 0
for i in range(len(text) - len(pat) + 1):
    if text[i:i + len(pat)] == pat:
        overlap += 1
print(text.count(pat))
print(overlap)
