from functools import partial

from_binary = partial(int, base=2)
from_hex = partial(int, base=16)
b, h = input().split()
print(from_binary(b), from_hex(h))
print(from_binary(b) + from_hex(h))
