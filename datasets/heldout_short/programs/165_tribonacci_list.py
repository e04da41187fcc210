n = int(input())
seq = [0, 0, 1]
while len(seq) < n:
    seq.append(seq[-1] + seq[-2] + seq[-3])
print(seq[n - 1])
