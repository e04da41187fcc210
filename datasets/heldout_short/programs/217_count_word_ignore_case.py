words = input().lower().split()
target = input().strip().lower()
print(words.count(target))
