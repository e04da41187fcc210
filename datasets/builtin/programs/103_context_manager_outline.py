class Outline:
    def __init__(self):
        self.depth = 0
        self.lines = []
        self.counters = [0]

    def section(self, title):
        return Section(self, title)

    def note(self, text):
        self.lines.append("    " * self.depth + "- " + text)


class Section:
    def __init__(self, outline, title):
        self.outline = outline
        self.title = title

    def __enter__(self):
        out = self.outline
        out.counters[-1] += 1
        number = ".".join(str(c) for c in out.counters)
        out.lines.append("    " * out.depth + f"{number} {self.title}")
        out.depth += 1
        out.counters.append(0)
        return self

    def __exit__(self, exc_type, exc, tb):
        out = self.outline
        out.depth -= 1
        out.counters.pop()
        return False


doc = Outline()
stack = []
for raw in open(0).read().splitlines():
    level = (len(raw) - len(raw.lstrip())) // 2
    text = raw.strip()
    while len(stack) > level:
        stack.pop().__exit__(None, None, None)
    if text.startswith("*"):
        doc.note(text[1:].strip())
    else:
        sec = doc.section(text)
        sec.__enter__()
        stack.append(sec)
while stack:
    stack.pop().__exit__(None, None, None)

with doc.section("Appendix"):
    with doc.section("Glossary"):
        doc.note("terms")
print("\n".join(doc.lines))
print("final depth:", doc.depth, "top sections:", doc.counters[0])
