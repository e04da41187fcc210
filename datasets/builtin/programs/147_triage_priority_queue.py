import heapq
from dataclasses import dataclass, field
from itertools import count

ticket = count(1)


@dataclass(order=True)
class Patient:
    severity: int
    arrival: int
    name: str = field(compare=False)
    complaint: str = field(compare=False)


queue = []
treated = []
doctors_free = 0
lines = open(0).read().strip().splitlines()
for line in lines:
    parts = line.split(maxsplit=2)
    if parts[0] == "arrive":
        level, name, complaint = int(parts[1]), *parts[2].split(maxsplit=1)
        patient = Patient(-level, next(ticket), name, complaint)
        heapq.heappush(queue, patient)
        print(f"+ {name} (level {level}) queue={len(queue)}")
    elif parts[0] == "treat":
        doctors_free = int(parts[1])
        while doctors_free > 0 and queue:
            patient = heapq.heappop(queue)
            doctors_free -= 1
            treated.append(patient.name)
            print(f"  treating {patient.name}: {patient.complaint} (level {-patient.severity})")
        if doctors_free:
            print(f"  {doctors_free} doctor(s) idle")

print("treated order:", treated)
remaining = [p.name for p in sorted(queue)]
print("still waiting:", remaining)
