tank = int(input())
stops = 0
left = tank
for leg in map(int, input().split()):
    if leg > left:
        stops += 1
        left = tank
    left -= leg
print(stops)
print(left, "left")
