n = input().strip()
odd_sum = sum(int(d) for d in n if int(d) % 2)
even_prod = 1
for d in n:
    if int(d) % 2 == 0:
        even_prod *= int(d)
print(odd_sum)
print(even_prod)
