class Kelvin:
    def __init__(self, k):
        self._k = k

    @property
    def celsius(self):
        return self._k - 273.15


t = Kelvin(float(input()))
print(round(t.celsius, 2))
