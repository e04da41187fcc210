print(sum(abs(int(x)) for x in input().split()))
