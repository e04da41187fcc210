s = input().strip()
print(s.isdigit(), s.replace(".", "", 1).isdigit())
