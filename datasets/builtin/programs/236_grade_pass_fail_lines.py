a, b = map(int, input().split())
for score in (a, b):
    print("pass" if score >= 60 else "fail")
