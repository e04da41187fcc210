days = list(map(float, input().split()))
wet = [d for d in days if d > 0]
print(f"total {sum(days):.1f} mm")
print(f"wet days {len(wet)}")
print(f"wettest day {days.index(max(days)) + 1}")
