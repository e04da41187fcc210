import sys


def safe_ratio(a, b):
    try:
        result = a / b
    except ZeroDivisionError:
        return None
    return result


def parse_pair(text):
    left, right = text.split("/")
    return int(left), int(right)


ok = 0
bad = 0
log = []
for raw in sys.stdin.read().split():
    try:
        num, den = parse_pair(raw)
        quotient = num // den
        remainder = num % den
    except ZeroDivisionError:
        bad += 1
        log.append(f"{raw:>8}: division by zero")
    except ValueError as exc:
        bad += 1
        log.append(f"{raw:>8}: cannot parse ({type(exc).__name__})")
    else:
        ok += 1
        log.append(f"{raw:>8}: {quotient} r {remainder}  ({num / den:.3f})")
    finally:
        log[-1] += " *" if "-" in raw else ""

print("\n".join(log))
print(f"ok={ok} bad={bad}")
samples = [(10, 4), (3, 0), (0, 5), (-7, 2)]
ratios = [safe_ratio(a, b) for a, b in samples]
print("ratios:", ratios)
valid = [r for r in ratios if r is not None]
print("mean of valid:", sum(valid) / len(valid))
