from itertools import takewhile, dropwhile

nums = list(map(int, input().split()))
print(list(takewhile(lambda x: x > 0, nums)))
print(list(dropwhile(lambda x: x > 0, nums)))
