from dataclasses import dataclass, field


class LibraryError(Exception):
    pass


@dataclass
class Book:
    isbn: str
    title: str
    copies: int
    borrowers: list = field(default_factory=list)


@dataclass
class Member:
    name: str
    limit: int = 2
    books: list = field(default_factory=list)
    fines: int = 0


catalog = {}
members = {}
lines = open(0).read().splitlines()
for line in lines:
    cmd, *args = line.split()
    try:
        if cmd == "book":
            catalog[args[0]] = Book(args[0], args[1].replace("_", " "), int(args[2]))
        elif cmd == "member":
            members[args[0]] = Member(args[0], int(args[1]))
        elif cmd == "borrow":
            m, b = members[args[0]], catalog[args[1]]
            if len(m.books) >= m.limit:
                raise LibraryError(f"{m.name} at limit {m.limit}")
            if b.copies == len(b.borrowers):
                raise LibraryError(f"no copies of {b.title!r} left")
            b.borrowers.append(m.name)
            m.books.append(b.isbn)
            print(f"{m.name} borrowed {b.title}")
        elif cmd == "return":
            m, b = members[args[0]], catalog[args[1]]
            days_late = int(args[2])
            m.books.remove(b.isbn)
            b.borrowers.remove(m.name)
            m.fines += max(0, days_late) * 25
            print(f"{m.name} returned {b.title} ({days_late} days late)")
    except KeyError as exc:
        print(f"unknown id {exc} in: {line}")
    except LibraryError as exc:
        print(f"refused: {exc}")
    except ValueError:
        print(f"bad return: {line}")
for m in members.values():
    print(f"{m.name:<6} holds {m.books} fines ${m.fines / 100:.2f}")
print(catalog["B2"])
