dist_km, minutes = map(float, input().split())
speed = dist_km / (minutes / 60)
print(f"{speed:.1f} km/h")
