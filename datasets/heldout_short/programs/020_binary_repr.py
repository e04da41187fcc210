n = int(input())
bits = ""
while n > 0:
    bits = str(n % 2) + bits
    n //= 2
print(bits or "0")
