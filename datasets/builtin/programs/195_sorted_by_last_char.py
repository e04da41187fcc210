print(sorted(input().split(), key=lambda w: w[-1]))
