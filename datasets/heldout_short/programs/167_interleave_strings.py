a = input().strip()
b = input().strip()
out = []
for i in range(max(len(a), len(b))):
    if i < len(a):
        out.append(a[i])
    if i < len(b):
        out.append(b[i])
print("".join(out))
