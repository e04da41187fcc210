import sys


def edit_distance(a, b):
    rows, cols = len(a) + 1, len(b) + 1
    dp = [[0] * cols for _ in range(rows)]
    for i in range(rows):
        dp[i][0] = i
    for j in range(cols):
        dp[0][j] = j
    for i in range(1, rows):
        for j in range(1, cols):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            dp[i][j] = min(dp[i - 1][j] + 1, dp[i][j - 1] + 1, dp[i - 1][j - 1] + cost)
    ops = []
    i, j = len(a), len(b)
    while i > 0 or j > 0:
        if i > 0 and j > 0 and dp[i][j] == dp[i - 1][j - 1] + (a[i - 1] != b[j - 1]):
            if a[i - 1] != b[j - 1]:
                ops.append(f"sub {a[i - 1]}->{b[j - 1]}")
            i -= 1
            j -= 1
        elif i > 0 and dp[i][j] == dp[i - 1][j] + 1:
            ops.append(f"del {a[i - 1]}")
            i -= 1
        else:
            ops.append(f"ins {b[j - 1]}")
            j -= 1
    return dp[-1][-1], ops[::-1]


dictionary = sys.stdin.readline().split()
for word in sys.stdin.read().split():
    scored = sorted((edit_distance(word, d)[0], d) for d in dictionary)
    best_dist, best_word = scored[0]
    _, ops = edit_distance(word, best_word)
    if best_dist == 0:
        print(f"{word}: correct")
    else:
        print(f"{word}: did you mean {best_word!r}? (distance {best_dist}: {', '.join(ops)})")
