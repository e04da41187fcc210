def next_term(term):
    result = []
    i = 0
    while i < len(term):
        digit = term[i]
        run = 1
        while i + run < len(term) and term[i + run] == digit:
            run += 1
        result.append(str(run) + digit)
        i += run
    return "".join(result)


seed, count = input().split()
count = int(count)
term = seed
lengths = []
for n in range(1, count + 1):
    lengths.append(len(term))
    display = term if len(term) <= 30 else term[:27] + "..."
    print(f"{n:2d}: {display}")
    term = next_term(term)

ratios = []
for a, b in zip(lengths, lengths[1:]):
    ratios.append(b / a)
print("lengths:", lengths)
print("last growth ratio: %.4f" % ratios[-1])
digit_counts = {d: term.count(d) for d in "123"}
print("digits in next term:", ", ".join(f"{d}x{c}" for d, c in digit_counts.items()))
