n = int(input())
print(sum([True, False, True]) * n, True + True)
