def power(base, exp):
    if exp == 0:
        return 1
    half = power(base, exp // 2)
    if exp % 2:
        return half * half * base
    return half * half


b, e = map(int, input().split())
print(power(b, e))
