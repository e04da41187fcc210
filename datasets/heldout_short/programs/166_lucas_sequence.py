n = int(input())
seq = [2, 1]
while len(seq) < n:
    seq.append(seq[-1] + seq[-2])
print(" ".join(map(str, seq[:n])))
