a, b = map(int, input().split())
print(bin(a).count("1"), bin(b).count("1"))
print(a ^ b, a & b)
