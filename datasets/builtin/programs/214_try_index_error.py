items = input().split()
i = int(input())
try:
    print(items[i])
except IndexError:
    print("no item", i)
