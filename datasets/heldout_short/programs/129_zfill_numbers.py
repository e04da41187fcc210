print(" ".join(x.zfill(4) for x in input().split()))
