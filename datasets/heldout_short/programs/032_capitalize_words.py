print(" ".join(w.capitalize() for w in input().split()))
