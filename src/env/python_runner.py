# trace-train's runner for `python:FILE.py` environments.
#
# Trusted code: it runs as the program of a sandbox session
# (crates/sandbox/src/session.rs), in the slot's namespaces under its uid,
# rlimits and seccomp, with the slot's /tmp as its working folder. It loads
# the user's environment file, then answers one JSON line for each JSON
# line the host (src/env/python.rs) sends:
#
#   {"id": N, "op": "files", "source": S}
#       -> the names in the file's top-level `FILES = [...]` (data files
#          the host reads beside it and sends with "load")
#   {"id": N, "op": "load", "source": S, "path": P, "files": {name: hex}}
#       -> what the file defines: functions, multi_step, task_count, timeout
#   {"id": N, "op": "task", "task_id": K}               -> task(K)
#   {"id": N, "op": "score", "task": T, "completion": C} -> score(T, C)
#   {"id": N, "op": "demonstration", "task": T}          -> demonstration(T)
#   {"id": N, "op": "feedback", "task": T, "completion": C}
#   {"id": N, "op": "start", "task": T}       -> an episode id (Episode(T))
#   {"id": N, "op": "step", "episode": E, "action": A}  -> episode E's step(A)
#   {"id": N, "op": "expert", "episode": E}   -> episode E's expert(), or None
#   {"id": N, "op": "end", "episode": E}      -> forgets episode E
#
# Answers: {"id": N, "ok": VALUE}, or {"id": N, "error": KIND, "detail":
# TEXT} where KIND is "exception" (the user's code raised; TEXT is the
# traceback) or "value" (it returned something that is not JSON).
#
# The protocol has fds of its own: the user's code sees /dev/null as stdin
# and stderr as stdout, so a print() never reaches the host as an answer.

import json
import os
import sys
import traceback
import types

MAIN_PID = os.getpid()

# The protocol's own fds; 0 and 1 become /dev/null and stderr for the user.
PROTO_IN = os.fdopen(os.dup(0), "rb", buffering=0)
PROTO_OUT = os.dup(1)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
os.dup2(2, 1)
sys.stdin = open(os.devnull)
sys.stdout = sys.stderr

USER = None
EPISODES = {}
NEXT_EPISODE = 0


def top_level_files(source):
    """The literal list a top-level `FILES = [...]` assigns, without running
    the file."""
    import ast

    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FILES" for t in node.targets):
            names = ast.literal_eval(node.value)
            if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
                raise ValueError("FILES must be a list of file names")
            return list(names)
    return []


def load(source, path, files):
    global USER
    for name, data in files.items():
        target = os.path.join(os.getcwd(), name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(bytes.fromhex(data))
    stem = os.path.splitext(os.path.basename(path))[0] or "environment"
    module = types.ModuleType(stem)
    module.__file__ = path
    sys.modules[stem] = module
    import linecache

    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
    USER = module
    names = [n for n in ("task", "score", "demonstration", "feedback") if callable(getattr(module, n, None))]
    episode = getattr(module, "Episode", None)
    count = getattr(module, "TASK_COUNT", None)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError("TASK_COUNT must be a whole number above 0, not %r" % (count,))
    timeout = getattr(module, "TIMEOUT", None)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError("TIMEOUT must be a number of seconds above 0, not %r" % (timeout,))
    return {
        "functions": names,
        "multi_step": isinstance(episode, type) and callable(getattr(episode, "step", None)),
        "task_count": count,
        "timeout": timeout,
    }


def dispatch(req):
    global NEXT_EPISODE
    op = req["op"]
    if op == "files":
        return top_level_files(req["source"])
    if op == "load":
        return load(req["source"], req["path"], req.get("files", {}))
    if op == "task":
        return USER.task(req["task_id"])
    if op == "score":
        return USER.score(req["task"], req["completion"])
    if op == "demonstration":
        return USER.demonstration(req["task"])
    if op == "feedback":
        return USER.feedback(req["task"], req["completion"])
    if op == "start":
        NEXT_EPISODE += 1
        EPISODES[NEXT_EPISODE] = USER.Episode(req["task"])
        return NEXT_EPISODE
    if op == "step":
        step = EPISODES[req["episode"]].step(req["action"])
        if isinstance(step, dict) and step.get("done"):
            EPISODES.pop(req["episode"], None)
        return step
    if op == "expert":
        expert = getattr(EPISODES[req["episode"]], "expert", None)
        return expert() if callable(expert) else None
    if op == "end":
        EPISODES.pop(req["episode"], None)
        return None
    raise ValueError("unknown op %r" % (op,))


def user_traceback():
    """The traceback without the runner's own frames."""
    t, v, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(t, v, tb))


def send(line):
    view = memoryview((line + "\n").encode())
    while view:
        view = view[os.write(PROTO_OUT, view) :]


while True:
    raw = PROTO_IN.readline()
    if not raw:
        os._exit(0)
    req = json.loads(raw)
    try:
        value = dispatch(req)
    except BaseException:
        if os.getpid() != MAIN_PID:
            os._exit(0)  # a process the user's code forked: it never answers
        line = json.dumps({"id": req["id"], "error": "exception", "detail": user_traceback()})
    else:
        if os.getpid() != MAIN_PID:
            os._exit(0)
        try:
            line = json.dumps({"id": req["id"], "ok": value}, allow_nan=False)
        except (TypeError, ValueError) as e:
            detail = "%s() returned a %s that is not JSON (%s)" % (req["op"], type(value).__name__, e)
            line = json.dumps({"id": req["id"], "error": "value", "detail": detail})
    value = None
    send(line)
