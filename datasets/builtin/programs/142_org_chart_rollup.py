import sys

employees = {}
reports = {}
for line in sys.stdin:
    name, title, salary, boss = line.split(",")
    boss = boss.strip()
    employees[name] = (title, int(salary))
    reports.setdefault(name, [])
    if boss:
        reports.setdefault(boss, []).append(name)

ceo = [n for n in employees if all(n not in subs for subs in reports.values())][0]


def print_tree(name, prefix="", last=True):
    title, salary = employees[name]
    branch = "" if name == ceo else ("`-- " if last else "|-- ")
    print(f"{prefix}{branch}{name} ({title}, {salary:,})")
    children = sorted(reports[name])
    extension = "" if name == ceo else ("    " if last else "|   ")
    for i, child in enumerate(children):
        print_tree(child, prefix + extension, i == len(children) - 1)


def payroll(name):
    total = employees[name][1]
    for sub in reports[name]:
        total += payroll(sub)
    return total


def depth(name):
    return 1 + max((depth(s) for s in reports[name]), default=0)


print_tree(ceo)
for manager in sorted(n for n in employees if reports[n]):
    team_cost = payroll(manager)
    print(f"{manager:<6} team of {len(reports[manager])} direct, payroll {team_cost:>8,}")
print("levels:", depth(ceo))
