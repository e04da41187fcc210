nums = list(map(int, input().split()))
evens = [n for n in nums if n % 2 == 0]
odds = [n for n in nums if n % 2 == 1]
print(len(evens), len(odds))
print(sum(evens) - sum(odds))
