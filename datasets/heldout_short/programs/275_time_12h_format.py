for _ in range(3):
    h, m = map(int, input().split(":"))
    suffix = "AM" if h < 12 else "PM"
    h12 = h % 12 or 12
    print(f"{h12}:{m:02d} {suffix}")
