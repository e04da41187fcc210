x = float(input())
print(f"{x:.2f} {x:e} {x:08.3f}")
