def divide(a, b):
    try:
        q = a // b
    except ZeroDivisionError:
        return "undefined"
    else:
        return q
    finally:
        log.append(b)


log = []
a = int(input())
outs = [divide(a, int(b)) for b in input().split()]
print(outs)
print(log)
