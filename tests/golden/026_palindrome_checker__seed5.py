def normalize(text):
    return ''.join((ch.lower() for ch in text if ch.isalnum()))

def longest_pal_sub(s):
    best = ''
    for center in range(len(s)):
        for lo, hi in ((center, center), (center, center + 1)):
            while lo >= 0 and hi < len(s) and (s[lo] == s[hi]):
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
    print('__DBG_0__', repr(pal_count) if isinstance(pal_count, (int, float, str, bool, type(None))) else type(pal_count).__name__, repr(_) if isinstance(_, (int, float, str, bool, type(None))) else type(_).__name__)
    clean = normalize(phrase)
    print('__DBG_1__', repr(count) if isinstance(count, (int, float, str, bool, type(None))) else type(count).__name__)
    is_pal = clean == clean[::-1]
    print('__DBG_2__', repr(phrase) if isinstance(phrase, (int, float, str, bool, type(None))) else type(phrase).__name__)
    if is_pal:
        pal_count += 1
        print('__DBG_3__', repr(pal_count) if isinstance(pal_count, (int, float, str, bool, type(None))) else type(pal_count).__name__, repr(count) if isinstance(count, (int, float, str, bool, type(None))) else type(count).__name__, repr(is_pal) if isinstance(is_pal, (int, float, str, bool, type(None))) else type(is_pal).__name__)
        verdict = 'PALINDROME'
        print('__DBG_4__', repr(verdict) if isinstance(verdict, (int, float, str, bool, type(None))) else type(verdict).__name__)
    else:
        verdict = 'no'
    print('__DBG_5__', repr(pal_count) if isinstance(pal_count, (int, float, str, bool, type(None))) else type(pal_count).__name__)
    inner = longest_pal_sub(clean)
    print(f'{phrase[:28]:<28} | {verdict:<10} | longest inner: {inner}')
print('palindromes found: %d of %d' % (pal_count, count))
