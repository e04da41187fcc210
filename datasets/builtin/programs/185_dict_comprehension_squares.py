n = int(input())
print({i: i * i for i in range(n)})
