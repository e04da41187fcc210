class TrafficLight:
    TRANSITIONS = {"red": "green", "green": "yellow", "yellow": "red"}
    DURATIONS = {"red": 4, "green": 3, "yellow": 1}

    def __init__(self, name):
        self.name = name
        self.state = "red"
        self.remaining = self.DURATIONS["red"]
        self.changes = 0

    def tick(self, emergency=False):
        if emergency and self.state != "red":
            self.state = "red"
            self.remaining = self.DURATIONS["red"]
            self.changes += 1
            return
        self.remaining -= 1
        if self.remaining == 0:
            self.state = self.TRANSITIONS[self.state]
            self.remaining = self.DURATIONS[self.state]
            self.changes += 1

    def __str__(self):
        return f"{self.name}:{self.state[0].upper()}{self.remaining}"


ticks = int(input())
emergencies = set(map(int, input().split()))
north = TrafficLight("N")
east = TrafficLight("E")
for _ in range(2):
    east.tick()

history = []
for t in range(1, ticks + 1):
    em = t in emergencies
    north.tick(em)
    east.tick(em)
    marker = "!" if em else " "
    history.append(f"t={t:2d}{marker} {north} {east}")
    if north.state == "green" and east.state == "green":
        history.append("   conflict: both green")

print("\n".join(history))
print("changes:", north.changes, east.changes)
