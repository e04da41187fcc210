class Book:
    def __init__(self, title, pages):
        self.title = title
        self.pages = pages

    def __repr__(self):
        return f"Book({self.title!r}, {self.pages})"


books = []
for entry in input().split(","):
    title, pages = entry.strip().rsplit(" ", 1)
    books.append(Book(title, int(pages)))
books.sort(key=lambda b: b.pages)
print(books[0])
print(books[-1])
