n = int(input())
count = 0
while n:
    n //= 10
    count += 1
print(count)
