for token in input().split():
    try:
        print(int(token) * 10)
    except ValueError:
        print("skip", token)
