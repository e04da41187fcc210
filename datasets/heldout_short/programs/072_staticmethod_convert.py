class Units:
    @staticmethod
    def km_to_miles(km):
        return km * 0.621371

    @classmethod
    def describe(cls, km):
        return f"{km} km = {cls.km_to_miles(km):.3f} mi"


print(Units.describe(float(input())))
