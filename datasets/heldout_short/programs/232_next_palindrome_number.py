n = int(input()) + 1
tries = 1
while str(n) != str(n)[::-1]:
    n += 1
    tries += 1
print(n)
print(tries)
