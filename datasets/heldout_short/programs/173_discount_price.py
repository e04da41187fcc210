price = float(input())
percent = int(input())
saved = price * percent / 100
print(f"saved {saved:.2f}")
print(f"pay {price - saved:.2f}")
