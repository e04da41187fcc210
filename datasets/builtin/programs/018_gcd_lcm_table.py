def gcd(a, b):
    while b:
        a, b = b, a % b
    return a


def lcm(a, b):
    return a // gcd(a, b) * b


nums = list(map(int, input().split()))
header = "gcd " + "".join(f"{n:>5}" for n in nums)
print(header)
for a in nums:
    row = f"{a:>4}"
    for b in nums:
        row += f"{gcd(a, b):>5}"
    print(row)

overall_gcd = 0
overall_lcm = 1
for n in nums:
    overall_gcd = gcd(overall_gcd, n)
    overall_lcm = lcm(overall_lcm, n)
print("gcd of all:", overall_gcd)
print("lcm of all:", overall_lcm)
coprime = 0
for i in range(len(nums)):
    for j in range(i + 1, len(nums)):
        if gcd(nums[i], nums[j]) == 1:
            coprime += 1
print("coprime pairs:", coprime)
