"""The CPU-only checks of kernel_server.py (no GPU, no numpy needed):

- the code-block extraction and the tier/reward logic, on fake outcomes;
- every task's statement, and its reference, wrong and faster kernels
  compiled with the server's compiler (nvcc or NVRTC, as --compiler picks),
  each expected to compile and to hold its kernel; their syntax-error
  variants expected to fail with `kernel.cu` in the log; a kernel without
  extern "C" expected to be reported as mangled;
- the server itself: started on a free port, asked GET /, /create, /reset,
  and a /step whose answer has a syntax error (a compile error observation);
  on a machine without a GPU, a /step whose answer compiles must answer the
  protocol's error saying so.

    python3 examples/agentgym/kernel_check.py [--compiler auto|nvcc|nvrtc] [--jobs 2]
    python3 examples/agentgym/kernel_server.py --self_check [same flags]

Nothing is launched on a GPU. Prints `N passed, N failed` last.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import urllib.request

import kernel_runner
import kernel_server
import kernel_tasks
from kernel_server import extract_code, tier

results = {"passed": 0, "failed": 0}


def expect(cond, what):
    if cond:
        results["passed"] += 1
    else:
        results["failed"] += 1
        print("FAILED:", what)


# ------------------------------------------------------------ extraction
def check_extraction():
    k = 'extern "C" __global__ void f(float* x) { x[0] = 1; }'
    expect(extract_code("no code here") is None, "prose without code: None")
    expect(extract_code("") is None, "empty: None")
    expect(extract_code(k) == k, "bare code holding __global__: the whole text")
    expect(extract_code(f"text\n```cuda\n{k}\n```\nmore") == k, "one cuda block")
    expect(extract_code(f"```cuda\nfirst\n```\n```cu\n{k}\n```") == k, "the last code block")
    expect(extract_code(f"```cuda\n{k}\n```\n```text\nnotes\n```") == k, "a cuda block beats a later text block")
    expect(extract_code(f"```python\nprint(1)\n```\n```\n{k}\n```") == k, "no cuda block: the last block")
    expect(extract_code(f"```\n{k}\n```\n```python\nprint(1)\n```") == "print(1)", "else the last block of any kind")
    for lang in ("cuda", "CUDA", "cu", "c++", "cpp", "c"):
        expect(extract_code(f"```txt\nx\n```\n```{lang}\n{k}\n```\n```txt\ny\n```") == k, f"language {lang}")
    expect(extract_code(f"```cuda\n{k}") == k, "a block left open runs to the end")
    expect(extract_code(f"  ```cuda\n{k}\n  ```") == k, "indented fences")
    expect(extract_code("```cuda\n\n```") is None, "an empty block: None")
    expect(extract_code(f"```cuda {{.kernel}}\n{k}\n```") == k, "info string after the language")


# ---------------------------------------------------------------- tiers
class Task:  # stands in for a kernel_tasks.Task
    def __init__(self, target):
        self.target, self.name = target, "t"

    def signature(self):
        return 'extern "C" __global__ void t()'


def correct(speedup):
    return {"status": "correct", "speedup": speedup, "time_us": 100.0 / speedup, "reference_us": 100.0, "iters": 20}


def check_tiers():
    t15, t09 = Task(1.5), Task(0.9)
    expect(tier({"status": "no_code"}, t15) == 0.0, "no code: 0")
    expect(tier({"status": "compile_error"}, t15) == 0.0, "compile error: 0")
    for st in ("missing", "load_error", "launch_error", "timeout", "crash", "wrong"):
        expect(tier({"status": st}, t15) == 0.1, f"{st}: 0.1")
    expect(tier(correct(0.5), t15) == 0.6, "correct, slow: 0.6")
    expect(tier(correct(0.9), t15) == 0.8, "correct, 0.9x: 0.8")
    expect(tier(correct(1.49), t15) == 0.8, "correct, 1.49x: 0.8")
    expect(tier(correct(1.5), t15) == 1.0, "correct, 1.5x: 1.0")
    expect(tier(correct(0.95), t09) == 1.0, "level 1, as fast: 1.0")
    expect(tier(correct(0.8), t09) == 0.6, "level 1, slower: 0.6")
    # Rewards: the rise of the best tier, never negative; done at the top.
    outcomes = [{"status": "wrong", "bad": 1, "count": 2, "output": "y", "where": "y[0]", "expected": 1.0,
                 "got": 2.0, "tolerance": 0.0, "max_abs_err": 1.0},
                {"status": "compile_error", "log": "kernel.cu(1): error", "compiler": "nvcc"},
                correct(0.5), correct(1.2), correct(0.7), {"status": "no_code"}, correct(2.0)]
    game = kernel_server.KernelGame()
    feed = iter(outcomes)
    game.judge = lambda task, seed, action: next(feed)
    game.reset(3)  # reduce_sum: target 1.5
    got = [game.step("x") for _ in outcomes]
    rewards = [round(r, 9) for _, r, _, _ in got]
    expect(rewards == [0.1, 0.0, 0.5, 0.2, 0.0, 0.0, 0.2], f"rewards rise with the best tier: {rewards}")
    expect([d for _, _, d, _ in got] == [False] * 6 + [True], "done only at the top tier")
    expect(got[-1][3] is True, "success at the top tier")
    expect(abs(sum(rewards) - 1.0) < 1e-9, "the return is the best tier")
    expect("result is wrong" in got[0][0] and "y[0]" in got[0][0], "a wrong result's observation")
    expect(got[1][0].startswith("Compile error"), "a compile error's observation")
    expect("speedup 1.20x" in got[3][0] and "Tier 0.8" in got[3][0], "a correct answer's observation")
    game.judge = lambda task, seed, action: {"status": "no_gpu", "error": "none"}
    game.reset(0)
    try:
        game.step("x")
        expect(False, "no GPU: an error")
    except RuntimeError as e:
        expect("no GPU" in str(e), "no GPU: the error says so")


# ------------------------------------------------------------ statements
def check_statements():
    expect(len(kernel_tasks.TASKS) == 9, "nine tasks")
    expect([t.level for t in kernel_tasks.TASKS] == [1, 1, 1, 2, 2, 2, 3, 3, 3], "three levels of three")
    for k in (0, 8, 9, 17, 900):
        task, seed = kernel_tasks.task_of(k)
        expect(task.index == k % 9 and seed == k // 9, f"data index {k}: task k mod 9, seed k div 9")
    for task in kernel_tasks.TASKS:
        s = task.statement(0)
        expect(task.signature() in s and "```cuda" in s and "gridDim" in s, f"{task.name}: the statement")
        expect(task.statement(5) == task.statement(5), f"{task.name}: the statement replays")
        sizes = [task.sizes(seed) for seed in range(20)]
        expect(len({json.dumps(x) for x in sizes}) > 1, f"{task.name}: the sizes vary with the seed")
        expect(task.signature() in task.reference and task.signature() in task.wrong, f"{task.name}: signatures")


# ------------------------------------------------------------- compiling
def check_compiles(compiler, jobs):
    work = []  # (what, source, name, expect: "ok" | "error" | "mangled")
    for t in kernel_tasks.TASKS:
        work += [(f"{t.name} reference", t.reference, t.name, "ok"), (f"{t.name} wrong", t.wrong, t.name, "ok"),
                 (f"{t.name} reference, syntax error", kernel_tasks.syntax_error(t.reference), t.name, "error")]
        if t.fast:
            work += [(f"{t.name} faster", t.fast, t.name, "ok"),
                     (f"{t.name} faster, syntax error", kernel_tasks.syntax_error(t.fast), t.name, "error")]
    t = kernel_tasks.TASKS[0]
    work += [("vector_add without extern \"C\"", t.reference.replace('extern "C" ', ""), t.name, "mangled"),
             ("vector_add misnamed", t.reference.replace("vector_add(", "vec_add("), t.name, "missing"),
             ("illegal address kernel", t.signature() + " { *(volatile float*)8 = 1.0f; }", t.name, "ok"),
             ("endless kernel", t.signature() + " { for (;;) __nanosleep(1000); }", t.name, "ok")]

    def one(item):
        what, source, name, want = item
        c = compiler.compile(source)
        return what, want, c, (kernel_server.missing_kernel(c.cubin, name) if c.ok else None)

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for what, want, c, missing in pool.map(one, work):
            if want == "ok":
                expect(c.ok and missing is None, f"{what}: compiles and holds its kernel ({c.log[:300]} {missing})")
            elif want == "error":
                expect(not c.ok and "kernel.cu" in c.log and "error" in c.log,
                       f"{what}: a compile error naming kernel.cu ({c.log[:300]})")
                expect("/tmp" not in c.log, f"{what}: the temporary path is hidden")
            elif want == "mangled":
                expect(c.ok and missing and "mangled" in missing, f"{what}: reported mangled ({missing})")
            else:
                expect(c.ok and missing and "no kernel named" in missing, f"{what}: reported missing ({missing})")
    print(f"# compiled {len(work)} sources with {compiler.describe()}")


# ---------------------------------------------------------------- server
def check_server(compiler_flag):
    cmd = [sys.executable, os.path.join(kernel_server.HERE, "kernel_server.py"), "--port", "0", "--seeds", "7",
           "--compiler", compiler_flag]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        expect(line.startswith("listening on "), f"the server's first line: {line!r}")
        url = f"http://127.0.0.1:{int(line.split()[-1])}"

        def call(route, body=None):
            data = None if body is None else json.dumps(body).encode()
            with urllib.request.urlopen(urllib.request.Request(url + route, data=data), timeout=120) as r:
                return json.loads(r.read())

        hello = call("/")
        expect(hello == {"name": "kernels", "tasks": 63, "opening": "", "action": "text"}, f"GET /: {hello}")
        sid = call("/create", {})["id"]
        r = call("/reset", {"id": sid, "data_idx": 10})
        expect("saxpy" in r["observation"] and r["reward"] == 0.0, "reset 10: saxpy")
        task = kernel_tasks.TASKS[1]
        r = call("/step", {"id": sid, "action": "```cuda\n" + kernel_tasks.syntax_error(task.reference) + "\n```"})
        expect(r.get("observation", "").startswith("Compile error") and r["reward"] == 0.0 and not r["done"],
               f"a syntax error: a compile error ({r})")
        r = call("/step", {"id": sid, "action": "I'd use a grid-stride loop."})
        expect(r.get("observation", "").startswith("No code block"), f"no code: said so ({r})")
        if not kernel_runner.gpu_present():
            r = call("/step", {"id": sid, "action": "```cuda\n" + task.reference + "\n```"})
            expect("error" in r and "no GPU" in r["error"], f"no GPU: the protocol's error ({r})")
        expect(call("/close", {"id": sid}) is True, "close")
    finally:
        p.terminate()
        p.wait(10)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiler", choices=["auto", "nvcc", "nvrtc"], default="auto")
    parser.add_argument("--arch", default="90")
    parser.add_argument("--jobs", type=int, default=2, help="compiles at once")
    parser.add_argument("--no_server", action="store_true")
    args = parser.parse_args(argv)
    check_extraction()
    check_tiers()
    check_statements()
    compiler = kernel_server.Compiler(args.compiler, args.arch, 60.0)
    check_compiles(compiler, args.jobs)
    if not args.no_server:
        check_server(args.compiler)
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
