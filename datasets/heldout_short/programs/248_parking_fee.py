minutes = int(input())
hours = (minutes + 59) // 60
fee = 0 if minutes <= 15 else min(hours * 3, 20)
print(hours, "hours")
print("fee", fee)
