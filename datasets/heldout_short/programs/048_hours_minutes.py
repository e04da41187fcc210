m = int(input())
print(f"{m // 60}h {m % 60:02d}m")
