a = input().split()
b = set(input().split())
only_a = [x for x in a if x not in b]
print(only_a)
print(len(a) - len(only_a), "shared")
