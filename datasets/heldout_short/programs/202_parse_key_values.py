pairs = {}
errors = 0
for part in input().split(";"):
    try:
        key, value = part.split("=")
        pairs[key.strip()] = value.strip()
    except ValueError:
        errors += 1
print(pairs)
print(errors, "malformed")
