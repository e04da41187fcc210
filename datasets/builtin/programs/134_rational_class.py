from math import gcd
from functools import reduce


class Rational:
    def __init__(self, num, den=1):
        if den == 0:
            raise ZeroDivisionError("zero denominator")
        if den < 0:
            num, den = -num, -den
        g = gcd(num, den)
        self.num = num // g
        self.den = den // g

    @classmethod
    def parse(cls, text):
        if "/" in text:
            a, b = text.split("/")
            return cls(int(a), int(b))
        return cls(int(text))

    def __add__(self, other):
        return Rational(self.num * other.den + other.num * self.den, self.den * other.den)

    def __sub__(self, other):
        return self + Rational(-other.num, other.den)

    def __mul__(self, other):
        return Rational(self.num * other.num, self.den * other.den)

    def __truediv__(self, other):
        return Rational(self.num * other.den, self.den * other.num)

    def __lt__(self, other):
        return self.num * other.den < other.num * self.den

    def __str__(self):
        return str(self.num) if self.den == 1 else f"{self.num}/{self.den}"

    def __repr__(self):
        return f"Rational({self.num}, {self.den})"


values = []
for token in input().split():
    try:
        values.append(Rational.parse(token))
    except ZeroDivisionError as exc:
        print(f"skip {token}: {exc}")
print("values:", ", ".join(map(str, values)))
total = reduce(lambda a, b: a + b, values, Rational(0))
product = reduce(lambda a, b: a * b, values, Rational(1))
print("sum:", total, "product:", product)
print("sorted:", sorted(values))
print("mean:", total / Rational(len(values)), "spread:", max(values) - min(values))
harmonic = reduce(lambda a, k: a + Rational(1, k), range(1, 7), Rational(0))
print(f"H6 = {harmonic} ~ {harmonic.num / harmonic.den:.4f}")
