n, upto = map(int, input().split())
print(" ".join(str(n * i) for i in range(1, upto + 1)))
