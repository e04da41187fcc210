nums = input().split()
letters = input().split()
print(list(zip(letters, map(int, nums))))
