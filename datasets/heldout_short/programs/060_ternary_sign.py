x = int(input())
print("positive" if x > 0 else "negative" if x < 0 else "zero")
