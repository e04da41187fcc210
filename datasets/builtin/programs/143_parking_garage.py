class Shift:
    def __init__(self, garage, attendant):
        self.garage = garage
        self.attendant = attendant

    def __enter__(self):
        self.start_revenue = self.garage.revenue
        self.garage.log.append(f"{self.attendant} starts shift")
        return self.garage

    def __exit__(self, exc_type, exc, tb):
        earned = self.garage.revenue - self.start_revenue
        self.garage.log.append(f"{self.attendant} ends shift, collected {earned}")
        return False


class Garage:
    RATE = {"car": 3, "bike": 1, "van": 5}

    def __init__(self, spots):
        self.free = list(range(1, spots + 1))
        self.parked = {}
        self.revenue = 0
        self.log = []

    def enter(self, plate, kind, hour):
        if not self.free:
            self.log.append(f"  full, turned away {plate}")
            return
        spot = self.free.pop(0)
        self.parked[plate] = (spot, kind, hour)
        self.log.append(f"  {plate} ({kind}) -> spot {spot}")

    def leave(self, plate, hour):
        spot, kind, start = self.parked.pop(plate)
        hours = max(1, hour - start)
        fee = hours * self.RATE[kind]
        self.revenue += fee
        self.free.append(spot)
        self.free.sort()
        self.log.append(f"  {plate} leaves spot {spot}, {hours}h, pays {fee}")


garage = Garage(3)
shifts = open(0).read().strip().split("\n\n")
for block in shifts:
    rows = block.splitlines()
    with Shift(garage, rows[0]) as g:
        for row in rows[1:]:
            parts = row.split()
            if parts[0] == "in":
                g.enter(parts[1], parts[2], int(parts[3]))
            else:
                g.leave(parts[1], int(parts[2]))
print("\n".join(garage.log))
print("still parked:", sorted(garage.parked), "revenue:", garage.revenue)
