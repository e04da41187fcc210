n = input().strip()
ok = all(int(a) % 2 != int(b) % 2 for a, b in zip(n, n[1:]))
print("alternating" if ok else "not alternating")
