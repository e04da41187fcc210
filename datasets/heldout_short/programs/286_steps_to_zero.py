n = int(input())
halvings = decrements = 0
while n > 0:
    if n % 2 == 0:
        n //= 2
        halvings += 1
    else:
        n -= 1
        decrements += 1
print("steps", halvings + decrements)
print("halvings", halvings)
print("decrements", decrements)
