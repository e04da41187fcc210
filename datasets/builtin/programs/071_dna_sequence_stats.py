from collections import Counter

COMPLEMENT = {"A": "T", "T": "A", "G": "C", "C": "G"}


def reverse_complement(seq):
    return "".join(COMPLEMENT[b] for b in reversed(seq))


def hamming(a, b):
    diff = 0
    for x, y in zip(a, b):
        if x != y:
            diff += 1
    return diff


names = []
seqs = []
for line in open(0):
    label, seq = line.split()
    names.append(label)
    seqs.append(seq.upper())

for label, seq in zip(names, seqs):
    counts = Counter(seq)
    gc = (counts["G"] + counts["C"]) / len(seq) * 100
    rc = reverse_complement(seq)
    base_line = " ".join(f"{b}:{counts[b]}" for b in "ACGT")
    print(f"{label}: len={len(seq)} GC={gc:.1f}% {base_line}")
    print(f"   revcomp {rc}")

print("pairwise hamming distances:")
for i in range(len(seqs)):
    row = []
    for j in range(len(seqs)):
        row.append(hamming(seqs[i], seqs[j]))
    print(f"   {names[i]:<4}" + "".join(f"{d:3d}" for d in row))
