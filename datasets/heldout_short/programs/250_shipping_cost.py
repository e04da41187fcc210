weight = float(input())
zone = input().strip()
base = {"local": 4, "national": 9, "intl": 25}[zone]
extra = max(0, weight - 2) * 1.5
print(f"base {base}")
print(f"extra {extra:.2f}")
print(f"total {base + extra:.2f}")
