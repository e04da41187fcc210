nums = list(map(int, input().split()))
print(all(n % 2 == 0 for n in nums), any(n > 6 for n in nums))
