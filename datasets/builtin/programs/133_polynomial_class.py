class Poly:
    def __init__(self, coeffs):
        coeffs = list(coeffs)
        while len(coeffs) > 1 and coeffs[-1] == 0:
            coeffs.pop()
        self.c = coeffs

    def __add__(self, other):
        n = max(len(self.c), len(other.c))
        a = self.c + [0] * (n - len(self.c))
        b = other.c + [0] * (n - len(other.c))
        return Poly(x + y for x, y in zip(a, b))

    def __mul__(self, other):
        out = [0] * (len(self.c) + len(other.c) - 1)
        for i, x in enumerate(self.c):
            for j, y in enumerate(other.c):
                out[i + j] += x * y
        return Poly(out)

    def __call__(self, x):
        result = 0
        for coef in reversed(self.c):
            result = result * x + coef
        return result

    def derivative(self):
        return Poly([i * c for i, c in enumerate(self.c)][1:] or [0])

    def __repr__(self):
        return f"Poly({self.c})"

    def __str__(self):
        terms = []
        for power in range(len(self.c) - 1, -1, -1):
            coef = self.c[power]
            if coef == 0:
                continue
            var = "" if power == 0 else "x" if power == 1 else f"x^{power}"
            num = "" if abs(coef) == 1 and power else str(abs(coef))
            sign = "-" if coef < 0 else "+"
            terms.append(f"{sign} {num}{var}")
        text = " ".join(terms) or "0"
        return text[2:] if text.startswith("+ ") else "-" + text[2:]


p = Poly(map(int, input().split()))
q = Poly(map(int, input().split()))
print("p =", p)
print("q =", q)
print("p + q =", p + q)
print("p * q =", p * q)
print("p' =", p.derivative(), "| repr:", repr(p.derivative()))
print("p(x) for x in 0..4:", [p(x) for x in range(5)])
