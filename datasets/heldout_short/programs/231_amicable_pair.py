def divisor_sum(n):
    return sum(d for d in range(1, n) if n % d == 0)


a, b = map(int, input().split())
print(divisor_sum(a))
print(divisor_sum(b))
print(divisor_sum(a) == b and divisor_sum(b) == a)
