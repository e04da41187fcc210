head, sep, tail = input().strip().partition("=")
print(head, tail)
