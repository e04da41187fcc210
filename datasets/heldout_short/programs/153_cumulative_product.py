nums = list(map(int, input().split()))
result = []
prod = 1
for n in nums:
    prod *= n
    result.append(prod)
print(result)
