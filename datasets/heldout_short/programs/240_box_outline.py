w = int(input())
print("+" + "-" * (w - 2) + "+")
print("|" + " " * (w - 2) + "|")
print("+" + "-" * (w - 2) + "+")
