calls = 0


def f(x):
    global calls
    calls += 1
    return x * 2


n = int(input())
result = f(f(n))
print(result, calls)
