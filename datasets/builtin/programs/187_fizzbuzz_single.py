n = int(input())
out = ""
if n % 3 == 0:
    out += "Fizz"
if n % 5 == 0:
    out += "Buzz"
print(out or n)
