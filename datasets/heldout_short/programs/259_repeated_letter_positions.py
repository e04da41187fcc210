word = input().strip()
positions = {}
for i, ch in enumerate(word):
    positions.setdefault(ch, []).append(i)
print({k: v for k, v in positions.items() if len(v) > 1})
