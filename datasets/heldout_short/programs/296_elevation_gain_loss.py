heights = list(map(int, input().split()))
gain = loss = 0
for a, b in zip(heights, heights[1:]):
    if b > a:
        gain += b - a
    else:
        loss += a - b
print("gain", gain)
print("loss", loss)
print("net", heights[-1] - heights[0])
