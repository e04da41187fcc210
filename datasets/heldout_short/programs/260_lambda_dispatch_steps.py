actions = {
    "double": lambda x: x * 2,
    "negate": lambda x: -x,
    "square": lambda x: x * x,
}
value = int(input())
for name in input().split():
    value = actions[name](value)
    print(name, value)
