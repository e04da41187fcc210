digits = input().replace(" ", "")
print("*" * (len(digits) - 4) + digits[-4:])
kinds = {"4": "visa", "5": "mastercard", "3": "amex"}
print(kinds.get(digits[0], "other"))
