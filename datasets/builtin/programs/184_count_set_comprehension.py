nums = input().split()
print(len({int(x) % 3 for x in nums}))
