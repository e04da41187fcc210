class ValidationError(Exception):
    def __init__(self, field, message):
        super().__init__(f"{field}: {message}")
        self.field = field


class AgeError(ValidationError):
    pass


def validate(record):
    name, age, email = record
    if not name.isalpha():
        raise ValidationError("name", f"{name!r} must be letters only")
    try:
        age_value = int(age)
    except ValueError:
        raise AgeError("age", f"{age!r} is not a number") from None
    if not 0 < age_value < 130:
        raise AgeError("age", f"{age_value} out of range")
    if email.count("@") != 1 or "." not in email.split("@")[1]:
        raise ValidationError("email", f"{email!r} looks invalid")
    return name.title(), age_value, email.lower()


accepted = []
failures = {"name": 0, "age": 0, "email": 0}
processed = 0
for line in open(0).read().strip().splitlines():
    parts = line.split(";")
    try:
        if len(parts) != 3:
            raise ValueError(f"expected 3 fields, got {len(parts)}")
        clean = validate(parts)
    except AgeError as exc:
        failures[exc.field] += 1
        print("AGE PROBLEM ->", exc)
    except ValidationError as exc:
        failures[exc.field] += 1
        print("INVALID ->", exc)
    except ValueError as exc:
        print("MALFORMED ->", exc)
    else:
        accepted.append(clean)
    finally:
        processed += 1

print("accepted:")
for name, age, email in accepted:
    print(f"  {name:<8}{age:>4}  {email}")
print(f"processed {processed}, accepted {len(accepted)}")
print("failures:", ", ".join(f"{k}={v}" for k, v in failures.items()))
