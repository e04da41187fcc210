from itertools import chain, zip_longest, islice, cycle

teams = {}
for line in open(0).read().strip().splitlines():
    team, members = line.split(":")
    teams[team.strip()] = members.split()

everyone = list(chain.from_iterable(teams.values()))
print("all members:", everyone)
print("count:", len(everyone))

interleaved = [m for m in chain(*zip_longest(*teams.values())) if m is not None]
print("round robin:", " ".join(interleaved))

days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
duty = {}
for day, person in zip(days, cycle(interleaved)):
    duty[day] = person
for day in days:
    print(f"  {day}: {duty[day]}")

shifts = dict.fromkeys(everyone, 0)
for person in islice(cycle(interleaved), 20):
    shifts[person] += 1
busiest = max(shifts.values())
print("20 shifts ->", [p for p in everyone if shifts[p] == busiest], "get", busiest)
letters = sorted(set(chain.from_iterable(everyone)))
print("distinct letters:", "".join(letters))
