def bubble_sort(values):
    arr = list(values)
    passes = 0
    swaps = 0
    swapped = True
    end = len(arr) - 1
    while swapped:
        swapped = False
        passes += 1
        for i in range(end):
            if arr[i] > arr[i + 1]:
                arr[i], arr[i + 1] = arr[i + 1], arr[i]
                swaps += 1
                swapped = True
        end -= 1
        print(f"  after pass {passes}: {arr}")
    return arr, passes, swaps


words = input().split()
nums = [int(x) for x in input().split()]
print("numbers:")
ordered, passes, swaps = bubble_sort(nums)
print(f"sorted in {passes} passes with {swaps} swaps")
by_len = sorted(words, key=lambda w: (len(w), w))
by_last = sorted(words, key=lambda w: w[-1])
desc = sorted(words, reverse=True)
print("words by length:", by_len)
print("words by last letter:", by_last)
print("words descending:", desc)
