a = tuple(int(x) for x in input().split("."))
b = tuple(int(x) for x in input().split("."))
if a > b:
    print("first is newer")
elif a < b:
    print("second is newer")
else:
    print("same version")
