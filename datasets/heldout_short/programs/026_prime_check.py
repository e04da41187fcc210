n = int(input())
is_prime = n > 1
i = 2
while i * i <= n:
    if n % i == 0:
        is_prime = False
        break
    i += 1
print("prime" if is_prime else "composite")
