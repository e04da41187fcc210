def permutations(items):
    if len(items) <= 1:
        return [items[:]]
    result = []
    used = set()
    for i in range(len(items)):
        head = items[i]
        if head in used:
            continue
        used.add(head)
        rest = items[:i] + items[i + 1:]
        for tail in permutations(rest):
            result.append([head] + tail)
    return result


def rank_of(word, perms):
    target = list(word)
    for idx, p in enumerate(perms):
        if p == target:
            return idx + 1
    return -1


word = input().strip()
letters = sorted(word)
perms = permutations(letters)
print("letters:", "".join(letters))
print("distinct permutations:", len(perms))
print("first five:", ", ".join("".join(p) for p in perms[:5]))
print("last two:", ", ".join("".join(p) for p in perms[-2:]))
print(f"rank of '{word}':", rank_of(word, perms))
others = input().split()
for other in others:
    print(f"rank of '{other}':", rank_of(other, perms))
