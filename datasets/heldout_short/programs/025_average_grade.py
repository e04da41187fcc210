scores = list(map(int, input().split()))
avg = sum(scores) / len(scores)
print(f"{avg:.2f}")
if avg >= 80:
    print("pass with merit")
