def choose(n, k):
    if k == 0 or k == n:
        return 1
    return choose(n - 1, k - 1) + choose(n - 1, k)


n, k = map(int, input().split())
print(choose(n, k))
