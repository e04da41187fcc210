words = input().split()
print(sorted(words, key=lambda w: (len(w), w)))
