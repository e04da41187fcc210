def popcount(x):
    count = 0
    while x:
        x &= x - 1
        count += 1
    return count


def reverse_bits(x, width):
    result = 0
    for _ in range(width):
        result = (result << 1) | (x & 1)
        x >>= 1
    return result


width = int(input())
values = list(map(int, input().split()))
xor_all = 0
and_all = (1 << width) - 1
or_all = 0
for v in values:
    xor_all ^= v
    and_all &= v
    or_all |= v
    low = v & -v
    is_pow2 = v > 0 and (v & (v - 1)) == 0
    print(f"{v:4d} {v:0{width}b} ones={popcount(v)} lowbit={low:<3} rev={reverse_bits(v, width):<4} pow2={is_pow2}")
print(f"xor of all: {xor_all} ({xor_all:0{width}b})")
print(f"and of all: {and_all} ({and_all:0{width}b})")
print(f"or of all : {or_all} ({or_all:0{width}b})")
