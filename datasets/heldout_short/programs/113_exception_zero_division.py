a, b = map(int, input().split())
try:
    print(a / b)
except ZeroDivisionError as e:
    print("error:", e)
finally:
    print("done")
