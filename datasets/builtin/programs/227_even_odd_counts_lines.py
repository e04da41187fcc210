nums = list(map(int, input().split()))
evens = sum(1 for n in nums if n % 2 == 0)
print("even:", evens)
print("odd:", len(nums) - evens)
