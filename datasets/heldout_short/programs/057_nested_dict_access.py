users = {
    "alice": {"age": 31, "langs": ["python", "go"]},
    "bob": {"age": 25, "langs": ["rust"]},
}
name = input().strip()
info = users.get(name, {})
print(info.get("age"), len(info.get("langs", [])))
