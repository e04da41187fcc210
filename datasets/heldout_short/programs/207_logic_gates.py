a, b = (s == "T" for s in input().split())
print("and", a and b)
print("or", a or b)
print("xor", a != b)
