class Thermostat:
    def __init__(self, target):
        self.target = target

    def action(self, reading):
        if reading < self.target - 1:
            return "heat"
        if reading > self.target + 1:
            return "cool"
        return "idle"


t = Thermostat(int(input()))
for r in input().split():
    print(r, t.action(int(r)))
