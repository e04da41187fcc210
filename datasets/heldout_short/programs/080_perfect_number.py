n = int(input())
divisors = [d for d in range(1, n) if n % d == 0]
print(sum(divisors) == n)
