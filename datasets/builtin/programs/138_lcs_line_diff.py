def lcs_table(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            if a[i] == b[j]:
                table[i][j] = table[i + 1][j + 1] + 1
            else:
                table[i][j] = max(table[i + 1][j], table[i][j + 1])
    return table


def diff(a, b):
    table = lcs_table(a, b)
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            out.append("  " + a[i])
            i += 1
            j += 1
        elif table[i + 1][j] >= table[i][j + 1]:
            out.append("- " + a[i])
            i += 1
        else:
            out.append("+ " + b[j])
            j += 1
    out.extend("- " + x for x in a[i:])
    out.extend("+ " + x for x in b[j:])
    return out, table[0][0]


text = open(0).read()
old_block, new_block, words = text.split("---\n")
old_lines = old_block.splitlines()
new_lines = new_block.splitlines()
lines, common = diff(old_lines, new_lines)
print("\n".join(lines))
added = sum(1 for line in lines if line.startswith("+"))
removed = sum(1 for line in lines if line.startswith("-"))
print(f"common={common} added={added} removed={removed}")
w1, w2 = words.split()
length = lcs_table(w1, w2)[0][0]
print(f"LCS({w1}, {w2}) length = {length}")
