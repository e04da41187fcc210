"""The child processes of kernel_server.py: each job runs in a fresh one, so
that a kernel that corrupts its CUDA context or never returns takes only
its own process down, and the parent can kill it.

    python3 kernel_runner.py probe              the GPU's name and compute capability (JSON on stdout)
    python3 kernel_runner.py nvrtc < JOB.json   compile with NVRTC (JSON on stdout)
    python3 kernel_runner.py evaluate < JOB.json  run, check and time a kernel (JSON into JOB's "result" file)

The GPU is reached through the CUDA driver API (libcuda.so.1) by ctypes;
numpy makes the inputs and the expected results. Nothing here loads
libcuda unless the machine has an NVIDIA device node (/dev/nvidiactl): a
toolkit's link stub must never be called.

An evaluation writes its answer to a file, never to stdout, where the
kernel's own printf output goes.
"""

import ctypes
import glob
import json
import os
import sys
import time

import kernel_tasks


def gpu_present():
    return os.path.exists("/dev/nvidiactl") or bool(glob.glob("/proc/driver/nvidia/gpus/*"))


# ------------------------------------------------------------------ NVRTC
def nvrtc_candidates(explicit=None):
    if explicit:
        return [explicit]
    names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    out = list(names)
    for home in [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]:
        if home:
            for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
                out += [os.path.join(home, sub, n) for n in names]
    for site in sys.path:  # PyPI's nvidia-cuda-nvrtc wheels
        out += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*")), reverse=True)
    return out


def load_nvrtc(explicit=None):
    errors = []
    for path in nvrtc_candidates(explicit):
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(str(e))
            continue
        if os.path.isabs(path):
            # NVRTC opens its builtins library by name: load the one beside
            # it first, for a directory the dynamic loader does not search.
            folder = os.path.dirname(os.path.realpath(path))
            for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))):
                try:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                    break
                except OSError:
                    pass
        return lib, path
    raise OSError("no NVRTC library found (" + "; ".join(errors[:3]) + ")")


def nvrtc_compile(job):
    """{"source", "arch", "lib", "include"} -> {"ok", "log", "cubin_path"}."""
    lib, _ = load_nvrtc(job.get("lib"))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    prog = ctypes.c_void_p()
    src = job["source"].encode()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"kernel.cu", 0, None, None)
    if r:
        return {"ok": False, "log": "nvrtcCreateProgram: " + lib.nvrtcGetErrorString(r).decode()}
    # nvcc's math.h macros, which NVRTC lacks (as -D: the log's line numbers stay the source's).
    opts = [f"--gpu-architecture=sm_{job['arch']}".encode(), b"--std=c++17",
            b"-DINFINITY=(__int_as_float(0x7f800000))", b"-DNAN=(__int_as_float(0x7fffffff))",
            b"-DFLT_MAX=(3.402823466e+38f)"]
    if job.get("include"):
        opts.append(f"--include-path={job['include']}".encode())
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value + 1)
    lib.nvrtcGetProgramLog(prog, buf)
    log = buf.value.decode(errors="replace")
    if r:
        return {"ok": False, "log": log or lib.nvrtcGetErrorString(r).decode()}
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    with open(job["cubin_path"], "wb") as f:
        f.write(cubin.raw)
    return {"ok": True, "log": log}


# ------------------------------------------------------------- driver API
class CudaError(Exception):
    def __init__(self, name, what):
        super().__init__(f"{what}: {name}")
        self.name, self.what = name, what


class Driver:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        self.lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self.lib.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
        self.lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        self.lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        self.lib.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.lib.cuEventSynchronize.argtypes = [ctypes.c_void_p]
        self.lib.cuEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]

    def __call__(self, what, result):
        if result != 0:
            name = ctypes.c_char_p()
            if self.lib.cuGetErrorName(result, ctypes.byref(name)) == 0 and name.value:
                raise CudaError(name.value.decode(), what)
            raise CudaError(f"CUDA error {result}", what)

    def init(self, ordinal=0):
        self("cuInit", self.lib.cuInit(0))
        self.dev = ctypes.c_int()
        self("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(self.dev), ordinal))
        self.ctx = ctypes.c_void_p()
        self("cuCtxCreate", self.lib.cuCtxCreate_v2(ctypes.byref(self.ctx), 0, self.dev))

    def attribute(self, attr):
        v = ctypes.c_int()
        self("cuDeviceGetAttribute", self.lib.cuDeviceGetAttribute(ctypes.byref(v), attr, self.dev))
        return v.value

    def name(self):
        buf = ctypes.create_string_buffer(256)
        self("cuDeviceGetName", self.lib.cuDeviceGetName(buf, 256, self.dev))
        return buf.value.decode()

    def alloc(self, nbytes):
        p = ctypes.c_uint64()
        self("cuMemAlloc", self.lib.cuMemAlloc_v2(ctypes.byref(p), max(nbytes, 4)))
        return p.value

    def upload(self, dptr, array):
        self("cuMemcpyHtoD", self.lib.cuMemcpyHtoD_v2(dptr, array.ctypes.data, array.nbytes))

    def download(self, array, dptr):
        self("cuMemcpyDtoH", self.lib.cuMemcpyDtoH_v2(array.ctypes.data, dptr, array.nbytes))

    def fill(self, dptr, byte, nbytes):
        self("cuMemsetD8", self.lib.cuMemsetD8_v2(dptr, byte, nbytes))

    def module(self, image):
        m = ctypes.c_void_p()
        self("cuModuleLoadData", self.lib.cuModuleLoadData(ctypes.byref(m), image))
        return m

    def function(self, module, name):
        f = ctypes.c_void_p()
        self("cuModuleGetFunction", self.lib.cuModuleGetFunction(ctypes.byref(f), module, name.encode()))
        return f

    def event(self):
        e = ctypes.c_void_p()
        self("cuEventCreate", self.lib.cuEventCreate(ctypes.byref(e), 0))
        return e

    def launch(self, f, grid, block, params):
        ptrs = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in params])
        self("cuLaunchKernel", self.lib.cuLaunchKernel(f, *grid, *block, 0, None, ptrs, None))

    def sync(self):
        self("cuCtxSynchronize", self.lib.cuCtxSynchronize())

    def record(self, e):
        self("cuEventRecord", self.lib.cuEventRecord(e, None))

    def elapsed_ms(self, start, stop):
        self("cuEventSynchronize", self.lib.cuEventSynchronize(stop))
        ms = ctypes.c_float()
        self("cuEventElapsedTime", self.lib.cuEventElapsedTime(ctypes.byref(ms), start, stop))
        return ms.value


def probe():
    if not gpu_present():
        return {"ok": False, "error": "no NVIDIA device on this machine"}
    try:
        d = Driver()
        d.init(int(os.environ.get("KERNEL_GPU", "0")))
        # 75, 76: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR
        return {"ok": True, "name": d.name(), "cc": f"{d.attribute(75)}{d.attribute(76)}"}
    except Exception as e:
        return {"ok": False, "error": str(e)}


# -------------------------------------------------------------- evaluation
class Instance:
    """A task's buffers on the GPU for one set of sizes."""

    def __init__(self, d, task, sizes):
        self.d, self.task, self.s = d, task, sizes
        self.grid, self.block = task.geometry(sizes)
        self.shapes = task.shapes(sizes)
        self.ptr = {name: d.alloc(4 * count) for name, count in self.shapes.items()}
        self.outputs = [n for k, n, _ in task.params if k in ("out", "inout")]
        self.start, self.stop = d.event(), d.event()

    def load(self, arrays):
        """Uploads a data set's inputs; the outputs' initial contents, the
        expected results and the tolerances come with it."""
        self.a = arrays
        for k, n, _ in self.task.params:
            if k == "in":
                self.d.upload(self.ptr[n], arrays[n])
        self.init = self.task.init(self.s, arrays)
        self.want = self.task.expected(self.s, arrays)
        self.tol = self.task.tolerance(self.s, arrays)

    def params(self):
        out = []
        for k, n, _ in self.task.params:
            if k == "int":
                out.append(ctypes.c_int(int(self.s[n])))
            elif k == "float":
                out.append(ctypes.c_float(float(self.s[n])))
            else:
                out.append(ctypes.c_uint64(self.ptr[n]))
        return out

    def reset_outputs(self, poison):
        """The stated initial contents; an output without any is set to NaN
        (every byte 0xFF) when `poison`, so that a kernel that leaves
        elements unwritten is caught."""
        for n in self.outputs:
            if n in self.init:
                self.d.upload(self.ptr[n], self.init[n])
            elif poison:
                self.d.fill(self.ptr[n], 0xFF, 4 * self.shapes[n])

    def run(self, f, poison=True):
        """One launch, timed; returns its milliseconds."""
        self.reset_outputs(poison)
        self.d.record(self.start)
        self.d.launch(f, self.grid, self.block, self.params())
        self.d.record(self.stop)
        self.d.sync()
        return self.d.elapsed_ms(self.start, self.stop)

    def check(self):
        """None when every output is within tolerance, else what is wrong."""
        import numpy as np

        for n in self.outputs:
            got = np.empty(self.shapes[n], np.float32)
            self.d.download(got, self.ptr[n])
            want = np.asarray(self.want[n], np.float64)
            err = np.abs(got.astype(np.float64) - want)
            tol = np.broadcast_to(np.asarray(self.tol[n], np.float64), err.shape)
            bad = ~(err <= tol)  # NaN counts as bad
            if bad.any():
                i = int(np.argmax(bad))
                finite = np.where(np.isfinite(err), err, np.inf)
                return {"output": n, "index": i, "where": self.where(n, i), "expected": float(want[i]),
                        "got": float(got[i]), "tolerance": float(tol[i]), "max_abs_err": float(finite.max()),
                        "bad": int(bad.sum()), "count": int(bad.size)}
        return None

    def where(self, name, i):
        """An element's index written as the statement writes it."""
        t, s = self.task.name, self.s
        if t == "transpose" and name == "out":
            return f"out[{i}] (row {i // s['rows']}, column {i % s['rows']} of the cols x rows output)"
        if t == "matmul":
            return f"C[{i}] (row {i // s['n']}, column {i % s['n']})"
        return f"{name}[{i}]"


def timed(inst, f, first_ms, most=20, budget_ms=1500.0):
    """Median milliseconds of up to `most` launches after a warm-up, fewer
    when a launch is slow."""
    import statistics

    iters = max(3, min(most, int(budget_ms / max(first_ms, 1e-3))))
    for _ in range(2 if first_ms < 50 else 0):
        inst.run(f, poison=False)
    return statistics.median(inst.run(f, poison=False) for _ in range(iters)), iters


def evaluate(job):
    """Runs the answer once and checks it, times it and the reference, then
    checks the answer again on a second data set (a kernel that remembers
    its first result, or works only once, fails there)."""
    if not gpu_present():
        return {"status": "no_gpu", "error": "no NVIDIA device on this machine"}
    try:
        import numpy  # noqa: F401
    except ImportError:
        return {"status": "internal", "error": "numpy is not installed"}
    task = kernel_tasks.TASKS[job["task"]]
    sizes = task.sizes(job["seed"])
    d = Driver()
    stage = "setting up the GPU"
    try:
        d.init(int(os.environ.get("KERNEL_GPU", "0")))
    except (OSError, CudaError) as e:
        return {"status": "no_gpu", "error": str(e)}
    try:
        with open(job["answer"], "rb") as fh:
            image = fh.read()
        stage = "loading the compiled module"
        try:
            answer = d.function(d.module(image), task.name)
        except CudaError as e:
            if e.what == "cuModuleGetFunction":
                return {"status": "missing", "error": e.name}
            return {"status": "load_error", "error": str(e)}
        with open(job["reference"], "rb") as fh:
            reference = d.function(d.module(fh.read()), task.name)
        inst = Instance(d, task, sizes)
        t0 = time.time()
        inst.load(task.arrays(sizes, task.rng(job["seed"], 0)))
        data_s = time.time() - t0
        stage = "the answer's first launch"
        first = inst.run(answer)
        wrong = inst.check()
        if wrong:
            return {"status": "wrong", "stage": "first launch", **wrong}
        stage = "timing the reference"
        ref_first = inst.run(reference)
        ref_wrong = inst.check()
        if ref_wrong:
            return {"status": "internal", "error": f"the reference kernel is wrong: {ref_wrong}"}
        ref_ms, ref_iters = timed(inst, reference, ref_first)
        stage = "timing the answer"
        ans_ms, ans_iters = timed(inst, answer, first)
        stage = "the answer's launch on a second data set"
        inst.load(task.arrays(sizes, task.rng(job["seed"], 1)))
        inst.run(answer)
        wrong = inst.check()
        if wrong:
            return {"status": "wrong", "stage": "second data set", **wrong}
        return {"status": "correct", "time_us": ans_ms * 1000.0, "reference_us": ref_ms * 1000.0,
                "speedup": ref_ms / max(ans_ms, 1e-9), "iters": ans_iters, "reference_iters": ref_iters,
                "data_s": round(data_s, 3)}
    except CudaError as e:
        return {"status": "launch_error", "error": e.name, "call": e.what, "stage": stage}


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    if argv[1] == "probe":
        print(json.dumps(probe()))
        return 0
    job = json.load(sys.stdin)
    if argv[1] == "nvrtc":
        try:
            out = nvrtc_compile(job)
        except OSError as e:
            out = {"ok": False, "internal": True, "log": str(e)}
        print(json.dumps(out))
        return 0
    if argv[1] == "evaluate":
        try:
            out = evaluate(job)
        except Exception as e:  # reported, not raised: the parent reads the file
            import traceback

            out = {"status": "internal", "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        with open(job["result"], "w") as f:
            json.dump(out, f)
        return 0
    sys.exit(f"unknown job {argv[1]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
