n = int(input())
print([i for i in range(n) if i % 3 == 0])
print([i for i in range(n) if i % 4 == 0])
