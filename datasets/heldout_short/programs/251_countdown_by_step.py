start, step = map(int, input().split())
print(list(range(start, 0, -step)))
