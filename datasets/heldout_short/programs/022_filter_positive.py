nums = [int(x) for x in input().split()]
pos = [x for x in nums if x > 0]
print(pos)
