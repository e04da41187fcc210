for km in map(int, input().split()):
    print(f"{km} km = {km * 0.621371:.2f} mi")
