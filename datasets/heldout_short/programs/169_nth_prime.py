n = int(input())
count = 0
candidate = 1
while count < n:
    candidate += 1
    if all(candidate % d for d in range(2, int(candidate ** 0.5) + 1)):
        count += 1
print(candidate)
