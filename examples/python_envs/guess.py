# Guess the number: a multi-step `python:` environment. The model guesses a
# number from 1 to 100; each guess is answered "higher" or "lower" with a
# small step reward for getting closer, and 1.0 when right. At most 7 turns.
# Its expert bisects what the hints leave open (demonstrations for
# `generate --environment`).
import random, re

TASK_COUNT = 1000
TURNS = 7


def task(task_id):
    secret = random.Random(task_id).randint(1, 100)
    return {
        "prompt": "I am thinking of a number from 1 to 100. Guess it: answer with one number.",
        "expected": str(secret),
    }


class Episode:
    def __init__(self, task):
        self.secret = int(task["expected"])
        self.turn = 0
        self.distance = 100
        self.lo, self.hi = 1, 100  # what the hints leave open

    def step(self, action):
        self.turn += 1
        numbers = re.findall(r"-?\d+", action)
        if not numbers:
            return {"observation": "Answer with one number.", "reward": 0.0,
                    "done": self.turn >= TURNS}
        guess = int(numbers[-1])
        if guess == self.secret:
            return {"reward": 1.0, "done": True, "success": True}
        distance = abs(guess - self.secret)
        reward = 0.1 if distance < self.distance else 0.0  # closer than before
        self.distance = min(distance, self.distance)
        hint = "higher" if guess < self.secret else "lower"
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
        else:
            self.hi = min(self.hi, guess - 1)
        return {"observation": f"{guess} is wrong: the number is {hint}.", "reward": reward,
                "done": self.turn >= TURNS}

    def expert(self):
        return str((self.lo + self.hi) // 2)


def demonstration(task):
    return task["expected"]
