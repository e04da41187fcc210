from dataclasses import dataclass


@dataclass(order=True)
class Job:
    priority: int
    name: str


jobs = [Job(int(p), f"job{i}") for i, p in enumerate(input().split())]
print(min(jobs))
