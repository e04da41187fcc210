k = int(input())
words = input().split()
long_words = [w for w in words if len(w) > k]
print(len(long_words))
print(", ".join(long_words))
