# The Trace task as a `python:` environment: the tasks the binary exported,
# scored with Trace's rule. Rewards equal the built-in `trace` environment's
# (tests/python_env.rs checks 200 tasks). Make the tasks file with
#   trace-train task --environment trace --task_id 0 --tasks 200 > examples/python_envs/trace_tasks.jsonl
import json, re

FILES = ["trace_tasks.jsonl"]  # sent into the sandbox beside this file
TASKS = [json.loads(line) for line in open("trace_tasks.jsonl")]
TASK_COUNT = len(TASKS)


def task(task_id):
    t = TASKS[task_id]
    return {"prompt": t["prompt"], "expected": t["key"]}


def score(task, completion):
    text = re.sub(r"<think>.*?</think>|<thinking>.*?</thinking>", "", completion, flags=re.S)
    for tag in ("</think>", "</thinking>"):
        if tag in text:
            text = text.rsplit(tag, 1)[1].strip()
    fence = re.search(r"```(?:[a-zA-Z]*)\n?(.*?)\n?```", text, flags=re.S)
    if fence:
        text = fence.group(1)
    squash = lambda s: "".join(s.split()).lower()
    return 1.0 if squash(text) == squash(task["expected"]) else 0.0


def demonstration(task):
    return task["expected"]
