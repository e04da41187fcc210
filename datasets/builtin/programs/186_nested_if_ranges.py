x = int(input())
if x > 10:
    if x % 5 == 0:
        print("big multiple of five")
    else:
        print("big")
else:
    print("small")
