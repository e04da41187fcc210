"""A reference of the Affine SAT / ABD / DED scorers as documented in
docs (affine-envs.md), written from the documentation for the parity test
(tests/affine_parity.rs); plain CPython, no third-party modules.

Reads JSON lines on stdin, one item each, and writes one JSON line per item
with its score. Programs are not run: an item says what the run printed, or
the run is simulated the same way on both sides ("echo": stdout is the stdin
the reply gives, for ABD; the extracted code, for DED).

Items:
  {"env": "sat", "task_id": N, "reply": str}
  {"env": "abd", "reply": str, "program": str, "expected": str, "stderr": str}
  {"env": "ded", "reply": str, "cases": [str | null, ...], "stderr": str}
"""
import json
import random
import re
import sys


# ---- SAT ----------------------------------------------------------------
def sat_clauses(task_id, n=15, k=10):
    rng = random.Random(task_id)
    m = int(4.26 * n)
    sol = {i: rng.choice([True, False]) for i in range(1, n + 1)}
    clauses = []
    for _ in range(m):
        vs = rng.sample(range(1, n + 1), k)
        sv = rng.choice(vs)
        clause = []
        for v in vs:
            if v == sv:
                positive = sol[v]
            else:
                positive = rng.choice([True, False])
            clause.append(v if positive else -v)
        clauses.append(clause)
    return clauses


def sat_score(reply, task_id):
    got = {}
    for digits, value in re.findall(r"x(\d+)=(True|False|1|0)", reply):
        got[int(digits)] = value.lower() in ("true", "1")
    for clause in sat_clauses(task_id):
        if not any(got.get(abs(lit)) == (lit > 0) for lit in clause):
            return 0.0
    return 1.0


# ---- ABD ----------------------------------------------------------------
INPUT_RE = r"<INPUT>(.*?)</INPUT>"


def abd_extract(reply):
    text = re.sub(r"<think>.*?</think>", "", reply, flags=re.DOTALL)
    text = re.sub(r"<thinking>.*?</thinking>", "", text, flags=re.DOTALL)
    found = re.findall(INPUT_RE, text, flags=re.IGNORECASE | re.DOTALL)
    if not found:
        return ""
    lines = [line.rstrip() for line in found[-1].strip().splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def abd_lines_ok(program, given):
    lines = given.splitlines() if given else []
    calls = program.count("input()")
    if "for _ in range(int(input()))" in program and lines and lines[0].isdigit():
        try:
            return len(lines) > int(lines[0])
        except ValueError:
            return False  # the original raises here: the evaluation scores 0
    return len(lines) >= calls


def abd_judge(expected, stdout, stderr):
    if stderr:
        return 0.0
    if expected == stdout:
        return 1.0
    if expected.strip().replace("\r\n", "\n") == stdout.strip().replace("\r\n", "\n"):
        return 1.0
    if [l.rstrip() for l in expected.splitlines()] == [l.rstrip() for l in stdout.splitlines()]:
        return 1.0
    return 0.0


def abd_score(item):
    reply = item["reply"].strip()
    if not reply:
        return 0.0
    given = abd_extract(reply)
    tags = re.search(INPUT_RE, reply, flags=re.IGNORECASE | re.DOTALL) is not None
    if not given and not tags:
        return 0.0
    if not abd_lines_ok(item["program"], given):
        return 0.0
    if given and not given.endswith("\n"):
        given += "\n"
    return abd_judge(item["expected"], given, item["stderr"])  # echo: stdout = stdin


# ---- DED ----------------------------------------------------------------
def strip_fences(text):
    blocks = re.findall(r"```python\s*\n(.*?)```", text, re.DOTALL)
    if blocks:
        return blocks[-1].strip()
    blocks = re.findall(r"```(?:\w*)\s*\n(.*?)```", text, re.DOTALL)
    if blocks:
        return blocks[-1].strip()
    m = re.search(r"```(?:python)?\s*([\s\S]*?)```", text, re.IGNORECASE)
    if m:
        return m.group(1).strip()
    return text.strip()


def norm(t):
    return "\n".join(line.rstrip() for line in t.rstrip().splitlines())


def ded_score(item):
    reply = item["reply"].strip()
    if not reply:
        return 0.0
    code = strip_fences(reply)
    total = len(item["cases"])
    passed = 0
    for expected in item["cases"]:
        if expected is None:  # a case of an unknown type
            total -= 1
            continue
        stdout, stderr = code, item["stderr"]  # echo: the program prints its code
        if stderr.strip() == "" and norm(stdout) == norm(expected):
            passed += 1
        else:
            break
    return 1.0 if passed == total else 0.0


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        item = json.loads(line)
        env = item["env"]
        if env == "sat":
            reply = item["reply"].strip()
            score = sat_score(reply, item["task_id"]) if reply else 0.0
        elif env == "abd":
            score = abd_score(item)
        elif env == "ded":
            score = ded_score(item)
        else:
            raise SystemExit("unknown env %r" % env)
        sys.stdout.write(json.dumps({"score": score}) + "\n")


if __name__ == "__main__":
    main()
