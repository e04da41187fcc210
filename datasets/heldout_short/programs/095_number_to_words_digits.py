names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
print(" ".join(names[int(d)] for d in input().strip()))
