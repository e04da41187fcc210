def is_prime(n):
    if n < 2:
        return False
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return False
    return True


limit = int(input())
twins = [(p, p + 2) for p in range(2, limit - 1) if is_prime(p) and is_prime(p + 2)]
print(len(twins))
print(twins[0])
print(twins[-1])
