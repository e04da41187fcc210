nums = input().split()
size = int(input())
chunks = [nums[i:i + size] for i in range(0, len(nums), size)]
print(chunks)
print(len(chunks), "chunks")
