print(" ".join(reversed(input().split())))
