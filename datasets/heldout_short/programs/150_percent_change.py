old, new = map(float, input().split())
change = (new - old) / old * 100
print(f"{change:+.1f}%")
