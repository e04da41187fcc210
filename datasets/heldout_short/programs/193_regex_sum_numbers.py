import re

text = input()
nums = [int(x) for x in re.findall(r"-?\d+", text)]
print(nums)
print(sum(nums))
