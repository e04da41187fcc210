text = input().strip()
try:
    value = int(text)
    print(value * 2)
except ValueError:
    print("not a number:", text)
