items, per_box = map(int, input().split())
boxes = -(-items // per_box)
print(boxes)
print(boxes * per_box - items, "empty slots")
