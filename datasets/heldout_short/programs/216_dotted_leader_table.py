for _ in range(3):
    name, score = input().split()
    print(name.ljust(8, ".") + score.rjust(4))
