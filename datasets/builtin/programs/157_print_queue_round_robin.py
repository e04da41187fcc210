from collections import deque
from functools import partial

quantum = int(input())
jobs = deque()
for line in iter(input, ""):
    user, pages = line.split()
    jobs.append([user, int(pages)])


def fmt_job(prefix, user, count):
    return f"{prefix}{user}({count})"


queued = partial(fmt_job, "")
done_fmt = partial(fmt_job, "done:")
tick = 0
timeline = []
finished = []
while jobs:
    user, pages = jobs.popleft()
    printed = min(quantum, pages)
    tick += printed
    pages -= printed
    timeline.append(f"{user}x{printed}")
    if pages:
        jobs.append([user, pages])
    else:
        finished.append((tick, user))
        print(done_fmt(user, tick), "| waiting:", " ".join(queued(u, p) for u, p in jobs) or "-")

print("timeline:", " ".join(timeline))
print("finish order:", [u for _, u in finished])
turnaround = sum(t for t, _ in finished) / len(finished)
print(f"average turnaround: {turnaround:.2f} pages")
