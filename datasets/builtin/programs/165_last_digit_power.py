b, e = map(int, input().split())
print(pow(b, e, 10))
