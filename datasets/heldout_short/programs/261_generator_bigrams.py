def bigrams(words):
    for i in range(len(words) - 1):
        yield words[i] + " " + words[i + 1]


words = input().split()
pairs = list(bigrams(words))
print(pairs)
print(len(set(pairs)), "distinct")
