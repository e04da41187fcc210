# A one-answer `python:` environment in a few lines: add two numbers.
import random, re


def task(task_id):
    rng = random.Random(task_id)
    a, b = rng.randint(1, 999), rng.randint(1, 999)
    return {"prompt": f"What is {a} + {b}? Answer with the number.", "expected": str(a + b)}


def score(task, completion):
    numbers = re.findall(r"-?\d+", completion)
    return 1.0 if numbers and numbers[-1] == task["expected"] else 0.0


def feedback(task, completion):
    return "Correct." if score(task, completion) else "Wrong: check the sum digit by digit."


def demonstration(task):
    return task["expected"]
