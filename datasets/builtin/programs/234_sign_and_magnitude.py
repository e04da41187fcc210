x = int(input())
print("negative" if x < 0 else "non-negative")
print(abs(x))
