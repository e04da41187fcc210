n = int(input())
sign = -1 if n < 0 else 1
print(sign * int(str(abs(n))[::-1]))
