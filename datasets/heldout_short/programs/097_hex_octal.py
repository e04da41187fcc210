n = int(input())
print(hex(n), oct(n))
