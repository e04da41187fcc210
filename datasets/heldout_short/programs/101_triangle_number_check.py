n = int(input())
k = 0
t = 0
while t < n:
    k += 1
    t += k
print(t == n, k)
