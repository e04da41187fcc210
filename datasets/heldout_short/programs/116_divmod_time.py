seconds = int(input())
h, rem = divmod(seconds, 3600)
m, s = divmod(rem, 60)
print(f"{h}:{m:02d}:{s:02d}")
