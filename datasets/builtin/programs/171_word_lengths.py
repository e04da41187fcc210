print([len(w) for w in input().split()])
