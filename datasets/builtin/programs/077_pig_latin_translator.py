VOWELS = "aeiou"


def to_pig_latin(word):
    core = word.strip(".,!?")
    tail = word[len(core):]
    if not core.isalpha():
        return word
    capital = core[0].isupper()
    lower = core.lower()
    if lower[0] in VOWELS:
        result = lower + "way"
    else:
        split = 0
        while split < len(lower) and lower[split] not in VOWELS:
            if lower[split:split + 2] == "qu":
                split += 2
                break
            split += 1
        result = lower[split:] + lower[:split] + "ay"
    if capital:
        result = result.capitalize()
    return result + tail


lines = open(0).read().splitlines()
total_words = 0
vowel_start = 0
for line in lines:
    words = line.split()
    total_words += len(words)
    for w in words:
        if w[0].lower() in VOWELS:
            vowel_start += 1
    translated = " ".join(to_pig_latin(w) for w in words)
    print(translated)
print("-" * 20)
print(f"words: {total_words}, starting with a vowel: {vowel_start}")
