class Animal:
    def sound(self):
        return "..."

    def speak(self):
        return f"{type(self).__name__} says {self.sound()}"


class Dog(Animal):
    def sound(self):
        return "woof"


class Cat(Animal):
    def sound(self):
        return "meow"


kind = input().strip()
pet = Dog() if kind == "dog" else Cat()
print(pet.speak())
