def build(**kwargs):
    return ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items()))


parts = input().split()
args = {parts[i]: int(parts[i + 1]) for i in range(0, len(parts), 2)}
print(build(**args))
