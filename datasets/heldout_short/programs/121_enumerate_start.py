for i, w in enumerate(input().split(), start=1):
    if i == 2:
        print(i, w)
