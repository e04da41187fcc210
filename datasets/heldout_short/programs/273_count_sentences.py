import re

text = input()
sentences = [s.strip() for s in re.split(r"[.!?]+", text) if s.strip()]
print(len(sentences))
print(max(sentences, key=len))
