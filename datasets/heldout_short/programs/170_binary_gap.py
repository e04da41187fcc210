n = int(input())
bits = bin(n)[2:]
gaps = bits.strip("0").split("1")
print(max(len(g) for g in gaps))
