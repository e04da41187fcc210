def checked_sqrt(x):
    if x < 0:
        raise ValueError(f"negative input {x}")
    return x ** 0.5


results = []
for tok in input().split():
    try:
        results.append(checked_sqrt(float(tok)))
    except ValueError as e:
        print(e)
print(results)
