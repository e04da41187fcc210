class Sentence:
    def __init__(self, text):
        self.words = text.split()

    def __len__(self):
        return len(self.words)

    def __getitem__(self, i):
        return self.words[i]


s = Sentence(input())
print(len(s))
print(s[-1], s[0])
print([w for w in s if len(w) > 4])
