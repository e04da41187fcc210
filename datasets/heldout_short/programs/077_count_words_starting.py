words = input().split()
letter = input().strip()
print(sum(1 for w in words if w.startswith(letter)))
