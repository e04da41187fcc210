"""A scripted client of kernel_server.py that shows its mechanics (standard
library only, over HTTP): for each data index (default 0..8, one of each
task) it plays, in one episode,

    1. an answer with no code block          expects: "No code block"
    2. the reference with a syntax error     expects: a compile error naming kernel.cu
    3. the reference without extern "C"      expects: the mangled-name report
    4. a kernel that computes a wrong thing  expects: a wrong result
    5. (first index only) an illegal address expects: a launch failure
    6. (--faults, first index) a kernel that never returns: a timeout
    7. the task's reference kernel           expects: correct
    8. the task's faster kernel, if any      expects: correct; its speedup is reported

printing each step's observation (clipped), reward and done, then a
summary a task. The episode stops early when it is done (the top tier).
Exit status 1 if any expected outcome did not happen (a syntax error not
reported as a compile error, the reference judged wrong, rewards that do
not add up to the best tier, ...); a faster kernel short of the task's
target is reported, not counted as a failure (timings vary by GPU).

    python3 examples/agentgym/kernel_policy.py --url http://127.0.0.1:36003 [--indices 0,1,2] [--faults]
"""

import argparse
import json
import sys
import urllib.request

import kernel_tasks

TIERS = (0.0, 0.1, 0.6, 0.8, 1.0)


def call(url, route, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url.rstrip("/") + route, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    if isinstance(out, dict) and "error" in out:
        raise RuntimeError(f"{route}: {out['error']}")
    return out


def fence(code):
    return f"Here is my kernel.\n\n```cuda\n{code.strip()}\n```\n"


def plays(task, first, faults):
    """(label, answer, check) in order; check(observation) -> bool."""
    sig = task.signature()
    out = [
        ("no code block", "I would launch one thread per element and add the values.",
         lambda o: o.startswith("No code block")),
        ("syntax error", fence(kernel_tasks.syntax_error(task.reference)),
         lambda o: o.startswith("Compile error") and "kernel.cu" in o),
        ("no extern \"C\"", fence(task.reference.replace('extern "C" ', "")),
         lambda o: "extern \"C\"" in o and "mangled" in o),
        ("wrong result", fence(task.wrong), lambda o: "result is wrong" in o),
    ]
    if first:
        out.append(("illegal address", fence(sig + " { *(volatile float*)8 = 1.0f; }"),
                    lambda o: "ILLEGAL_ADDRESS" in o or "LAUNCH_FAILED" in o))
        if faults:
            out.append(("never returns", fence(sig + " { for (;;) __nanosleep(1000); }"),
                        lambda o: "did not finish" in o))
    out.append(("reference", fence(task.reference), lambda o: o.startswith("Correct")))
    if task.fast:
        out.append(("faster", fence(task.fast), lambda o: o.startswith("Correct")))
    return out


def speedup_of(obs):
    if not obs.startswith("Correct"):
        return None
    return float(obs.split("speedup ")[1].split("x")[0])


def play(url, k, first, faults, clip):
    task, seed = kernel_tasks.task_of(k)
    sid = call(url, "/create", {})["id"]
    failures, fed_back, best_speedup, score, best_tier = [], False, None, 0.0, 0.0
    try:
        obs = call(url, "/reset", {"id": sid, "data_idx": k})["observation"]
        print(f"=== data index {k}: {task.name} (level {task.level}), seed {seed}")
        print("    " + obs[:clip].replace("\n", "\n    ") + (" ..." if len(obs) > clip else ""))
        for label, answer, check in plays(task, first, faults):
            r = call(url, "/step", {"id": sid, "action": answer})
            obs = r["observation"]
            ok = check(obs)
            print(f"--- {label}: reward {r['reward']:g}, score {r['score']:g}, done {r['done']}"
                  f"{'' if ok else '   <-- UNEXPECTED'}")
            print("    " + obs[:clip].replace("\n", "\n    ") + (" ..." if len(obs) > clip else ""))
            if not ok:
                failures.append(f"{task.name}: {label} was not reported as expected")
            if r["reward"] < 0:
                failures.append(f"{task.name}: {label} earned a negative reward")
            score = r["score"]
            if label == "syntax error" and ok:
                fed_back = True
            s = speedup_of(obs)
            if s is not None:
                best_speedup = max(best_speedup or 0.0, s)
                best_tier = max(best_tier, 1.0 if s >= task.target else 0.8 if s >= kernel_tasks.AS_FAST else 0.6)
            elif "result is wrong" in obs or obs.startswith("It compiled"):
                best_tier = max(best_tier, 0.1)
            if label == "faster" and s is not None and s < task.target:
                print(f"    note: the faster kernel's speedup {s:.2f}x is short of the target {task.target:g}x")
            if r["done"]:
                break
        if abs(score - best_tier) > 1e-9:
            failures.append(f"{task.name}: the rewards add up to {score:g}, the best tier reached is {best_tier:g}")
    finally:
        call(url, "/close", {"id": sid})
    return {"task": task.name, "compile_errors_fed_back": fed_back, "best_speedup": best_speedup,
            "return": score, "failures": failures}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:36003")
    parser.add_argument("--indices", default=",".join(str(i) for i in range(len(kernel_tasks.TASKS))))
    parser.add_argument("--faults", action="store_true", help="also play a kernel that never returns (a timeout)")
    parser.add_argument("--clip", type=int, default=600, help="characters of each observation printed")
    args = parser.parse_args(argv)
    hello = call(args.url, "/")
    print(f"server: {hello}")
    if hello.get("name") != "kernels" or hello.get("action") != "text":
        print("the server is not kernel_server.py")
        return 1
    rows = [play(args.url, int(k), i == 0, args.faults, args.clip)
            for i, k in enumerate(args.indices.split(","))]
    print("\nsummary")
    print(f"{'task':12} {'compile error fed back':24} {'correct':8} {'best speedup':13} return")
    for r in rows:
        sp = f"{r['best_speedup']:.2f}x" if r["best_speedup"] is not None else "-"
        print(f"{r['task']:12} {'yes' if r['compile_errors_fed_back'] else 'no':24} "
              f"{'yes' if r['best_speedup'] is not None else 'no':8} {sp:13} {r['return']:g}")
    failures = [f for r in rows for f in r["failures"]]
    for f in failures:
        print("FAILED:", f)
    print("all expected outcomes happened" if not failures else f"{len(failures)} unexpected outcomes")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
