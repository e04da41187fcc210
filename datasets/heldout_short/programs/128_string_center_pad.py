word, width = input().split()
print("[" + word.center(int(width), "*") + "]")
