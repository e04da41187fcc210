#!/usr/bin/env python3
"""The peer approach to running a corpus of programs, for `trace-train bench sandbox`.

What data pipelines for the Trace task commonly do: a thread pool
(concurrent.futures) and one `subprocess.run([python, file])` per program,
with a timeout and captured output, and no isolation at all. Reads a JSON
list of {"program", "stdin"} on stdin; prints one JSON object of timings.

    python3 benches/peer_sandbox.py --python /usr/bin/python3 --workers 2 --repeat 3 < programs.json
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time


def run_one(python, program, stdin, timeout):
    fd, path = tempfile.mkstemp(suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(program)
        try:
            r = subprocess.run(
                [python, path],
                input=stdin.encode(),
                capture_output=True,
                timeout=timeout,
                env={"PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin"},
            )
            return r.returncode == 0
        except subprocess.TimeoutExpired:
            return False
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args()
    items = json.load(sys.stdin) * args.repeat
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as pool:
        ok = sum(pool.map(lambda it: run_one(args.python, it["program"], it["stdin"], args.timeout), items))
    elapsed = time.perf_counter() - t0
    print(json.dumps({"programs": len(items), "ok": ok, "seconds": elapsed, "programs_per_s": len(items) / elapsed}))


if __name__ == "__main__":
    main()
