h = list(map(int, input().split()))
peaks = [i for i in range(1, len(h) - 1) if h[i - 1] < h[i] > h[i + 1]]
print(len(peaks))
print(peaks)
print([h[i] for i in peaks])
