a = input().strip()
b = input().strip()
print(len(a) == len(b) and b in a + a)
print((a + a).find(b))
