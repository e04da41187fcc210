text = input()
sub = input().strip()
print(sub in text, text.find(sub))
