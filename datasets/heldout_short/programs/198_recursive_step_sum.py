def step_sum(n):
    if n <= 0:
        return 0
    return n + step_sum(n - 2)


n = int(input())
print(step_sum(n))
print(step_sum(n - 1))
print(step_sum(n) + step_sum(n - 1))
