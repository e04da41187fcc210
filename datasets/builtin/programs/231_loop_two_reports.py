n = int(input())
total = 0
squares = 0
for i in range(1, n + 1):
    total += i
    squares += i * i
print(total)
print(squares)
