w, h = map(float, input().split())
bmi = w / (h * h)
print(f"{bmi:.1f}")
print("normal" if 18.5 <= bmi < 25 else "other")
