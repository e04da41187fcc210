word = input().strip()
for i in range(1, 4):
    print(word[:i * len(word) // 3])
