import sys


class Builder:
    def __init__(self):
        self.lines = []
        self.level = 0
        self.open_tags = []
        self.max_depth = 0

    def tag(self, name, **attrs):
        return Tag(self, name, attrs)

    def text(self, content):
        self.lines.append("  " * self.level + content)


class Tag:
    def __init__(self, builder, name, attrs):
        self.builder = builder
        self.name = name
        self.attrs = attrs

    def __enter__(self):
        b = self.builder
        attr_text = "".join(f' {k.rstrip("_")}="{v}"' for k, v in self.attrs.items())
        b.lines.append("  " * b.level + f"<{self.name}{attr_text}>")
        b.level += 1
        b.open_tags.append(self.name)
        b.max_depth = max(b.max_depth, b.level)
        return b

    def __exit__(self, exc_type, exc, tb):
        b = self.builder
        b.level -= 1
        b.open_tags.pop()
        b.lines.append("  " * b.level + f"</{self.name}>")
        return False


title = input().strip()
rows = [line.split(",") for line in sys.stdin.read().strip().splitlines()]
header, body = rows[0], rows[1:]
doc = Builder()
with doc.tag("table", class_="report"):
    with doc.tag("caption"):
        doc.text(title)
    with doc.tag("tr"):
        for cell in header:
            with doc.tag("th"):
                doc.text(cell.strip())
    for index, row in enumerate(body):
        with doc.tag("tr", class_="odd" if index % 2 else "even"):
            doc.text("".join(f"<td>{cell.strip()}</td>" for cell in row))
print("\n".join(doc.lines))
print(f"<!-- {len(doc.lines)} lines, depth {doc.max_depth}, open {doc.open_tags} -->")
