n = int(input())
for d in range(2, n):
    if n % d == 0:
        print(d, n // d)
        break
else:
    print("prime")
