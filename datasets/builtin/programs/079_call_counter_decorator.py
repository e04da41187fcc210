def counted(func):
    calls = {"n": 0}

    def wrapper(*args):
        calls["n"] += 1
        return func(*args)

    wrapper.calls = calls
    wrapper.__name__ = func.__name__
    return wrapper


@counted
def binomial(n, k):
    if k == 0 or k == n:
        return 1
    return binomial(n - 1, k - 1) + binomial(n - 1, k)


@counted
def power(base, exp):
    if exp == 0:
        return 1
    half = power(base, exp // 2)
    if exp % 2:
        return half * half * base
    return half * half


for line in open(0):
    kind, a, b = line.split()
    a, b = int(a), int(b)
    if kind == "C":
        before = binomial.calls["n"]
        value = binomial(a, b)
        used = binomial.calls["n"] - before
        print(f"C({a},{b}) = {value:<8} calls: {used}")
    else:
        before = power.calls["n"]
        value = power(a, b)
        used = power.calls["n"] - before
        print(f"{a}^{b} = {value:<10} calls: {used}")
for f in (binomial, power):
    print(f"{f.__name__}: {f.calls['n']} calls in total")
