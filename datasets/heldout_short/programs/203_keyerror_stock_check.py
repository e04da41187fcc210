stock = {"pen": 12, "ink": 0, "pad": 7}
for item in input().split():
    try:
        if stock[item] == 0:
            print(item, "out of stock")
            break
    except KeyError:
        print(item, "not carried")
        break
else:
    print("all available")
