words = input().split()
print(len(words))
print(len(set(words)))
