def normalize(text):
    return "".join(ch.lower() for ch in text if ch.isalnum())


def longest_pal_sub(s):
    best = ""
    for center in range(len(s)):
        for lo, hi in ((center, center), (center, center + 1)):
            while lo >= 0 and hi < len(s) and s[lo] == s[hi]:
                lo -= 1
                hi += 1
            candidate = s[lo + 1:hi]
            if len(candidate) > len(best):
                best = candidate
    return best


count = int(input())
pal_count = 0
for _ in range(count):
    phrase = input()
    clean = normalize(phrase)
    is_pal = clean == clean[::-1]
    if is_pal:
        pal_count += 1
        verdict = "PALINDROME"
    else:
        verdict = "no"
    inner = longest_pal_sub(clean)
    print(f"{phrase[:28]:<28} | {verdict:<10} | longest inner: {inner}")
print("palindromes found: %d of %d" % (pal_count, count))
