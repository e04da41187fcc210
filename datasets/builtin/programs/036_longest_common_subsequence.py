def lcs(a, b):
    n, m = len(a), len(b)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            if a[i] == b[j]:
                table[i][j] = table[i + 1][j + 1] + 1
            else:
                table[i][j] = max(table[i + 1][j], table[i][j + 1])
    i = j = 0
    out = []
    while i < n and j < m:
        if a[i] == b[j]:
            out.append(a[i])
            i += 1
            j += 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return "".join(out)


pairs = int(input())
for _ in range(pairs):
    first = input().strip()
    second = input().strip()
    common = lcs(first, second)
    shortest_super = len(first) + len(second) - len(common)
    print(f"{first} / {second}")
    print(f"  lcs = '{common}' (length {len(common)}), shortest supersequence {shortest_super}")
