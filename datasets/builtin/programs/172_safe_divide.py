def safe_div(a, b):
    if b == 0:
        return None
    return a / b


a, b = map(int, input().split())
print(safe_div(a, b))
print(safe_div(a, 0))
