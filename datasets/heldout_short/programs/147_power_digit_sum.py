n = int(input())
print(sum(int(d) for d in str(2 ** n)))
