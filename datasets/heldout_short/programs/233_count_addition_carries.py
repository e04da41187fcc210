a, b = input().split()
a, b = a.zfill(len(b)), b.zfill(len(a))
carry = count = 0
for x, y in zip(reversed(a), reversed(b)):
    carry = (int(x) + int(y) + carry) // 10
    count += carry
print(count)
