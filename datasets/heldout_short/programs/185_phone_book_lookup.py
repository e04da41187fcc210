book = {}
n = int(input())
for _ in range(n):
    name, number = input().split()
    book[name] = number
query = input().strip()
print(book.get(query, "unknown"))
print(len(book))
