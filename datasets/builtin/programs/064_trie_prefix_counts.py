def make_node():
    return {"children": {}, "count": 0, "end": False}


root = make_node()


def insert(word):
    node = root
    for ch in word:
        node = node["children"].setdefault(ch, make_node())
        node["count"] += 1
    node["end"] = True


def find(prefix):
    node = root
    for ch in prefix:
        if ch not in node["children"]:
            return None
        node = node["children"][ch]
    return node


def collect(node, prefix, out):
    if node["end"]:
        out.append(prefix)
    for ch in sorted(node["children"]):
        collect(node["children"][ch], prefix + ch, out)


words = input().split()
for w in words:
    insert(w)
queries = input().split()
for q in queries:
    node = find(q)
    if node is None:
        print(f"{q!r}: 0 words")
        continue
    found = []
    collect(node, q, found)
    print(f"{q!r}: {node['count']} words -> {', '.join(found)}")
everything = []
collect(root, "", everything)
print("all words sorted:", " ".join(everything))
