def edit_distance(a, b):
    n, m = len(a), len(b)
    dp = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        dp[i][0] = i
    for j in range(m + 1):
        dp[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            if a[i - 1] == b[j - 1]:
                cost = 0
            else:
                cost = 1
            delete = dp[i - 1][j] + 1
            insert = dp[i][j - 1] + 1
            replace = dp[i - 1][j - 1] + cost
            dp[i][j] = min(delete, insert, replace)
    return dp[n][m]


pairs = []
for line in open(0):
    line = line.strip()
    if line:
        left, right = line.split()
        pairs.append((left, right))

results = []
for left, right in pairs:
    d = edit_distance(left, right)
    longer = max(len(left), len(right))
    similarity = 1 - d / longer
    results.append((d, left, right))
    print("{:<10} -> {:<10} distance {} similarity {:.2f}".format(left, right, d, similarity))
results.sort()
print("closest pair:", results[0][1], results[0][2])
print("farthest pair:", results[-1][1], results[-1][2])
