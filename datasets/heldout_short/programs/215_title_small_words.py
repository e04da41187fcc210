small = {"a", "an", "the", "of", "and", "in"}
words = input().lower().split()
out = [w if w in small and i > 0 else w.capitalize() for i, w in enumerate(words)]
print(" ".join(out))
