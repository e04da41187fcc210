def strings(n):
    if n == 0:
        return [""]
    return [p + b for p in strings(n - 1) for b in "01"]


print(len(strings(int(input()))))
