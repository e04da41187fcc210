words = input().split()
print(min(words, key=len))
print(max(words, key=len))
