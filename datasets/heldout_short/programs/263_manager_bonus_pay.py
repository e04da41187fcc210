class Employee:
    def __init__(self, name, salary):
        self.name = name
        self.salary = salary

    def pay(self):
        return self.salary


class Manager(Employee):
    def __init__(self, name, salary, bonus):
        super().__init__(name, salary)
        self.bonus = bonus

    def pay(self):
        return super().pay() + self.bonus


staff = [Employee("ivy", 3000), Manager("raj", 4000, 1200)]
raise_pct = int(input())
for p in staff:
    p.salary += p.salary * raise_pct // 100
    print(p.name, p.pay())
