words = input().split()
print(sum(len(w) for w in words) / len(words))
