def greet(name, times=2, sep="!"):
    return sep.join([f"hi {name}"] * times)


n = int(input())
print(greet("ana", n))
print(greet("bo"))
