n = int(input())
print(", ".join(f"item{i}" for i in range(1, n + 1)))
