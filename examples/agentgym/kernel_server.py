"""CUDA kernels to write, behind AgentGym's protocol: a trusted server that
compiles the model's code and runs it on this machine's GPU. See README.md.

Data index k is task k mod 9 of kernel_tasks.py with instance seed k div 9
(the sizes vary with the seed within each task's stated range). The nine
tasks, in three levels: 1 vector (vector_add, saxpy, relu), 2 reduction
(reduce_sum, reduce_max, dot), 3 matrix (transpose, matvec, matmul; all
float32, row-major). GET / answers 9 * --seeds (default 100) tasks,
`"action": "text"` (the whole completion is the action) and an empty
`opening` (the observation alone is the prompt).

The first observation is the task's statement: what to compute, the
kernel's exact signature, the launch geometry this server uses, the
instance's sizes, the tolerance, the tiers. An action is the model's whole
answer; the code is its last ```cuda / ```cu / ```c++ / ```cpp / ```c
fenced block, else its last fenced block of any kind, else the whole text
when that holds `__global__`. The server compiles it (nvcc -cubin, or
NVRTC), runs it in a fresh child process (kernel_runner.py) on inputs from
the seed, checks it against numpy, times it and the task's reference kernel
(median of up to 20 launches after a warm-up, CUDA events), and checks it
again on a second data set. The next observation says what happened: no
code block; the compiler's error (its first 40 lines); the kernel missing
from the module; a launch failure or a timeout; the first wrong element
(expected, got, the tolerance); or its time, the reference's and the
speedup.

Tiers (the step reward is the rise of the best tier the episode has
reached, never negative, so an episode's return is its best tier):
    0    no code block, or a compile error
    0.1  compiled, but the kernel is missing, fails to launch, crashes,
         times out or computes a wrong result
    0.6  correct
    0.8  correct and at least as fast as the reference (speedup >= 0.9:
         timing noise is about that)
    1.0  correct and speedup >= the task's target: 1.5 at levels 2 and 3;
         at level 1, whose reference already streams memory at full
         bandwidth, 0.9 (so there 0.8 and 1.0 coincide)
The top tier ends the episode, a success; otherwise the episode goes on,
each observation inviting a better kernel, until the protocol's
--max_steps.

Flags: --compiler auto|nvcc|nvrtc (auto: nvcc when it is on PATH or at
$CUDA_HOME/bin/nvcc, else NVRTC), --arch (default the GPU's compute
capability, else 90), --nvrtc_lib PATH, --compile_timeout (60 s),
--run_timeout (20 s: the child is killed, a timeout), --gpus_at_once (4:
at most that many evaluations share the GPU at once, so that timings are
not wrecked by contention; compiles are not limited by it), --seeds (100),
--self_check (runs kernel_check.py: compiles, no GPU needed).

It runs the model's code on the GPU unsandboxed: run it only on a machine
you are willing to let that code touch, as its own user.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading

import kernel_tasks
import protocol

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "kernel_runner.py")
CODE_LANGS = ("cuda", "cu", "c++", "cpp", "c")
ERROR_LINES = 40


# ------------------------------------------------------------ extraction
def fenced_blocks(text):
    """[(language, code)] of the text's fenced blocks, in order; a block
    left open at the end runs to the end."""
    blocks, lang, lines = [], None, []
    for line in text.splitlines():
        stripped = line.strip()
        if lang is None:
            if stripped.startswith("```"):
                lang, lines = stripped[3:].strip().split(" ")[0].lower(), []
        elif stripped.startswith("```"):
            blocks.append((lang, "\n".join(lines)))
            lang = None
        else:
            lines.append(line)
    if lang is not None:
        blocks.append((lang, "\n".join(lines)))
    return blocks


def extract_code(text):
    """The answer's code, or None: the last cuda/cu/c++/cpp/c block, else
    the last block of any kind, else the whole text if it holds __global__."""
    blocks = [(lang, code) for lang, code in fenced_blocks(text) if code.strip()]
    for lang, code in reversed(blocks):
        if lang in CODE_LANGS:
            return code
    if blocks:
        return blocks[-1][1]
    if "__global__" in text:
        return text
    return None


# ------------------------------------------------------------- compiling
def find_nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return None


def clip(text, lines=ERROR_LINES):
    rows = text.strip().splitlines()
    if len(rows) > lines:
        rows = rows[:lines] + [f"... ({len(rows) - lines} more lines)"]
    return "\n".join(rows)


class Compiled:
    def __init__(self, ok, log, cubin=None):
        self.ok, self.log, self.cubin = ok, log, cubin


class Compiler:
    def __init__(self, mode, arch, timeout, nvrtc_lib=None):
        self.arch, self.timeout, self.nvrtc_lib = arch, timeout, nvrtc_lib
        self.nvcc = find_nvcc() if mode in ("auto", "nvcc") else None
        if mode == "nvcc" and not self.nvcc:
            raise SystemExit("--compiler nvcc: no nvcc on PATH or at $CUDA_HOME/bin/nvcc")
        self.mode = "nvcc" if self.nvcc else "nvrtc"
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ""
        self.include = os.path.join(home, "include") if home and os.path.isdir(os.path.join(home, "include")) else None

    def describe(self):
        return f"{self.nvcc} -cubin -arch=sm_{self.arch} -O3" if self.mode == "nvcc" else f"NVRTC, sm_{self.arch}"

    def compile(self, source):
        """A Compiled: the cubin's bytes, or the compiler's log."""
        folder = tempfile.mkdtemp(prefix="kernel-")
        try:
            with open(os.path.join(folder, "kernel.cu"), "w") as f:
                f.write(source + "\n")
            cubin = os.path.join(folder, "k.cubin")
            try:
                if self.mode == "nvcc":
                    p = subprocess.run([self.nvcc, "-cubin", f"-arch=sm_{self.arch}", "-O3", "-o", "k.cubin",
                                        "kernel.cu"], cwd=folder, capture_output=True, text=True,
                                       timeout=self.timeout)
                    ok, log = p.returncode == 0 and os.path.exists(cubin), p.stderr + p.stdout
                else:
                    job = {"source": source + "\n", "arch": self.arch, "cubin_path": cubin, "lib": self.nvrtc_lib,
                           "include": self.include}
                    p = subprocess.run([sys.executable, RUNNER, "nvrtc"], input=json.dumps(job), capture_output=True,
                                       text=True, timeout=self.timeout, cwd=HERE)
                    try:
                        out = json.loads(p.stdout.strip().splitlines()[-1])
                    except (ValueError, IndexError):
                        raise RuntimeError(f"the NVRTC child failed: {p.stderr[-1000:]}")
                    if out.get("internal"):
                        raise RuntimeError(out["log"])
                    ok, log = out["ok"], out["log"]
            except subprocess.TimeoutExpired:
                return Compiled(False, f"the compiler did not finish within {self.timeout:g} s")
            log = log.replace(folder + os.sep, "").replace(folder, ".")
            if not ok:
                return Compiled(False, log or "the compiler failed and said nothing")
            with open(cubin, "rb") as f:
                return Compiled(True, log, f.read())
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def elf_functions(image):
    """{name: is_kernel} of the function symbols of a cubin (ELF64);
    a kernel carries STO_CUDA_ENTRY (0x10) in st_other."""
    if image[:4] != b"\x7fELF":
        return None
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sec[6]][4]
        for off in range(sec[4], sec[4] + sec[5], 24):
            name, info, other, _, _, _ = struct.unpack_from("<IBBHQQ", image, off)
            if info & 0xF == 2:  # STT_FUNC
                start = strtab + name
                out[image[start:image.index(b"\0", start)].decode(errors="replace")] = bool(other & 0x10)
    return out


def missing_kernel(image, name):
    """None when the module has the kernel `name`, else what is wrong."""
    funcs = elf_functions(image)
    if funcs is None or funcs.get(name):
        return None
    if name in funcs:
        return f"`{name}` is in the module but is not a __global__ kernel."
    mangled = [f for f, kernel in funcs.items() if kernel and f"{len(name)}{name}" in f]
    if mangled:
        return (f"the module has `{mangled[0]}`, a C++-mangled name: declare the kernel `extern \"C\"` so that "
                f"it is found as `{name}`.")
    kernels = sorted(f for f, kernel in funcs.items() if kernel)
    return f"the module has no kernel named `{name}` (it has: {', '.join(kernels) or 'no kernels'})."


# --------------------------------------------------------------- running
class Evaluator:
    def __init__(self, compiler, gpus_at_once, run_timeout):
        self.compiler, self.run_timeout = compiler, run_timeout
        self.gpu = threading.BoundedSemaphore(gpus_at_once)
        self.lock = threading.Lock()
        self.references = {}

    def reference(self, task):
        with self.lock:
            if task.name not in self.references:
                c = self.compiler.compile(task.reference)
                if not c.ok:
                    raise RuntimeError(f"the reference kernel of {task.name} does not compile:\n{c.log}")
                self.references[task.name] = c.cubin
            return self.references[task.name]

    def run(self, task, seed, cubin):
        """The child's result dict (kernel_runner.evaluate), or a timeout."""
        import kernel_runner

        if not kernel_runner.gpu_present():
            return {"status": "no_gpu", "error": "no NVIDIA device on this machine"}
        reference = self.reference(task)
        folder = tempfile.mkdtemp(prefix="kernel-run-")
        try:
            job = {"task": task.index, "seed": seed, "answer": os.path.join(folder, "answer.cubin"),
                   "reference": os.path.join(folder, "reference.cubin"), "result": os.path.join(folder, "result.json")}
            with open(job["answer"], "wb") as f:
                f.write(cubin)
            with open(job["reference"], "wb") as f:
                f.write(reference)
            with self.gpu:
                try:
                    p = subprocess.run([sys.executable, RUNNER, "evaluate"], input=json.dumps(job), cwd=HERE,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                       timeout=self.run_timeout)
                except subprocess.TimeoutExpired:
                    return {"status": "timeout", "seconds": self.run_timeout}
            try:
                with open(job["result"]) as f:
                    return json.load(f)
            except (OSError, ValueError):
                return {"status": "crash", "code": p.returncode, "stderr": p.stderr[-2000:]}
        finally:
            shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------ tiers, observations
def tier(outcome, task):
    """The tier of an evaluation outcome (see the module's docstring)."""
    status = outcome["status"]
    if status in ("no_code", "compile_error"):
        return 0.0
    if status != "correct":
        return 0.1
    speedup = outcome["speedup"]
    if speedup >= task.target:
        return 1.0
    if speedup >= kernel_tasks.AS_FAST:
        return 0.8
    return 0.6


def fmt(x):
    return f"{x:.6g}"


def describe(outcome, task):
    """The observation after a step: what happened, exactly."""
    st = outcome["status"]
    again = "Answer again with one ```cuda code block holding the whole kernel."
    if st == "no_code":
        return ("No code block found in your answer. " + again +
                f" The kernel's signature: {task.signature()}")
    if st == "compile_error":
        return f"Compile error ({outcome['compiler']}):\n{clip(outcome['log'])}\n{again}"
    if st == "missing":
        return f"It compiled, but {outcome['error']} {again}"
    if st == "load_error":
        return f"It compiled, but the module could not be loaded: {outcome['error']}. {again}"
    if st == "launch_error":
        return (f"It compiled, but {outcome['stage']} failed: {outcome['error']} (from {outcome['call']}). "
                "An illegal address is a read or write outside an array: check the bounds against the launch "
                f"geometry. {again}")
    if st == "timeout":
        return (f"It compiled, but the run did not finish within {fmt(outcome['seconds'])} s and was killed "
                f"(a kernel that never returns?). {again}")
    if st == "crash":
        return f"It compiled, but the process running it died (exit {outcome['code']}). {again}"
    if st == "wrong":
        when = "on a second set of inputs, after timing" if outcome.get("stage") == "second data set" else ""
        return (f"It compiled and ran, but the result is wrong{(' ' + when) if when else ''}: "
                f"{outcome['bad']} of {outcome['count']} elements of `{outcome['output']}` are outside the "
                f"tolerance. First: {outcome['where']} expected {fmt(outcome['expected'])}, got "
                f"{fmt(outcome['got'])} (tolerance there {fmt(outcome['tolerance'])}); the largest absolute error "
                f"is {fmt(outcome['max_abs_err'])}. {again}")
    if st == "correct":
        t = tier(outcome, task)
        head = (f"Correct. Your kernel: {outcome['time_us']:.1f} us (median of {outcome['iters']} launches); "
                f"the reference: {outcome['reference_us']:.1f} us; speedup {outcome['speedup']:.2f}x. Tier {t:g}.")
        if t >= 1.0:
            return head + " That is the top tier: the task is done."
        goal = outcome["reference_us"] / task.target
        return (head + f" The top tier asks for a speedup of at least {task.target:g}x (about {goal:.1f} us or "
                "less). You may answer with a faster kernel, again in one ```cuda code block.")
    raise ValueError(f"unknown outcome {outcome}")


# ------------------------------------------------------------------ game
class KernelGame:
    evaluator = None  # set by main
    judge = None  # (task, seed, answer text) -> outcome; tests may replace it

    def reset(self, data_idx):
        if data_idx < 0:
            raise ValueError(f"data_idx {data_idx} is negative")
        self.task, self.seed = kernel_tasks.task_of(data_idx)
        self.best = 0.0
        return self.task.statement(self.seed)

    def step(self, action):
        outcome = (self.judge or judge)(self.task, self.seed, action)
        if outcome["status"] == "no_gpu":
            raise RuntimeError(f"the kernel compiled, but this server has no GPU to run it on ({outcome['error']})")
        if outcome["status"] == "internal":
            raise RuntimeError(f"the server failed evaluating the kernel: {outcome['error']}")
        t = tier(outcome, self.task)
        reward = max(0.0, t - self.best)
        self.best = max(self.best, t)
        done = t >= 1.0
        return describe(outcome, self.task), reward, done, done


def judge(task, seed, action):
    """The outcome of an answer: extracted, compiled, run."""
    ev = KernelGame.evaluator
    code = extract_code(action)
    if code is None:
        return {"status": "no_code"}
    c = ev.compiler.compile(code)
    if not c.ok:
        return {"status": "compile_error", "log": c.log, "compiler": ev.compiler.mode}
    missing = missing_kernel(c.cubin, task.name)
    if missing:
        return {"status": "missing", "error": missing}
    return ev.run(task, seed, c.cubin)


def probe_arch():
    p = subprocess.run([sys.executable, RUNNER, "probe"], capture_output=True, text=True, timeout=60, cwd=HERE)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "error": p.stderr[-500:]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiler", choices=["auto", "nvcc", "nvrtc"], default="auto")
    parser.add_argument("--arch", default=None, help="sm_ARCH's number, e.g. 90 (default: the GPU's, else 90)")
    parser.add_argument("--nvrtc_lib", default=None, help="the libnvrtc to load (default: searched)")
    parser.add_argument("--compile_timeout", type=float, default=60.0)
    parser.add_argument("--run_timeout", type=float, default=20.0)
    parser.add_argument("--gpus_at_once", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--self_check", action="store_true")
    args, rest = parser.parse_known_args(argv)
    if args.self_check:
        import kernel_check

        return kernel_check.main([a for a in (sys.argv[1:] if argv is None else argv) if a != "--self_check"])
    arch = args.arch
    if arch is None:
        gpu = probe_arch()
        arch = gpu["cc"] if gpu.get("ok") else "90"
        print(f"# GPU: {gpu.get('name', 'none')} ({gpu.get('error', 'sm_' + arch)})", file=sys.stderr)
    compiler = Compiler(args.compiler, str(arch).removeprefix("sm_"), args.compile_timeout, args.nvrtc_lib)
    print(f"# compiler: {compiler.describe()}", file=sys.stderr)
    try:
        first = compiler.compile(kernel_tasks.TASKS[0].reference)
    except RuntimeError as e:
        first = Compiled(False, str(e))
    if not first.ok:
        sys.exit(f"the compiler does not work here: {first.log}")
    KernelGame.evaluator = Evaluator(compiler, args.gpus_at_once, args.run_timeout)
    return protocol.serve("kernels", len(kernel_tasks.TASKS) * args.seeds, KernelGame, argv=rest,
                          description=__doc__, hello={"opening": "", "action": "text"})


if __name__ == "__main__":
    sys.exit(main())
