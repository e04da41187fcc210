print(input().swapcase())
