class Animal:
    sound = "..."
    legs = 4
    population = 0

    def __init__(self, name, age, food_kg):
        self.name = name
        self.age = age
        self.food_kg = food_kg
        Animal.population += 1

    def speak(self):
        return f"{self.name} says {self.sound}"

    def daily_cost(self, price_per_kg):
        return self.food_kg * price_per_kg

    def __str__(self):
        return f"{type(self).__name__.lower()} {self.name} ({self.age}y)"


class Lion(Animal):
    sound = "ROAR"


class Parrot(Animal):
    sound = "squawk"
    legs = 2

    def __init__(self, name, age, food_kg, words):
        super().__init__(name, age, food_kg)
        self.words = words

    def speak(self):
        base = super().speak()
        return base + (f" and '{self.words[0]}'" if self.words else "")


class Snake(Animal):
    legs = 0

    def daily_cost(self, price_per_kg):
        return super().daily_cost(price_per_kg) / 7


kinds = {"lion": Lion, "parrot": Parrot, "snake": Snake}
price = float(input())
zoo = []
for line in iter(input, "done"):
    kind, name, age, food, *words = line.split()
    extra = [words] if kind == "parrot" else []
    zoo.append(kinds[kind](name, int(age), float(food), *extra))

total = 0.0
for animal in sorted(zoo, key=lambda a: (type(a).__name__, -a.age)):
    cost = animal.daily_cost(price)
    total += cost
    print(f"{str(animal):<22} {cost:>7.2f}/day  | {animal.speak()}")
print(f"animals: {Animal.population}, legs: {sum(a.legs for a in zoo)}, daily food bill: {total:.2f}")
