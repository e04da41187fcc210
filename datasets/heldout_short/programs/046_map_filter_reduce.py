from functools import reduce

nums = list(map(int, input().split()))
evens = list(filter(lambda x: x % 2 == 0, nums))
product = reduce(lambda a, b: a * b, evens, 1)
print(evens)
print(product)
