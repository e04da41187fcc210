ch = input().strip()
for i in range(1, 4):
    print("." * (3 - i) + ch * i)
