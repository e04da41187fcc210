"""The nine CUDA kernel tasks of kernel_server.py (see its docstring).

Each task has a name (the kernel's name too), a level (1 vector, 2
reduction, 3 matrix), its parameters, the launch geometry the server uses,
a reference kernel (straightforward and correct: it is compiled and timed
beside every answer), a wrong kernel and, where one was written, a faster
kernel (both for kernel_policy.py and kernel_check.py), the instance sizes
drawn from the seed (pure Python, so that a statement needs no numpy),
input data drawn from the seed (numpy), the numpy reference result and the
tolerance it is checked with.

Measured on an H200 (nvcc 13.0, sm_90): the faster kernels reach 3x
(transpose) to over 100x (the reductions, whose references add every
element into one address) the reference's speed; the ones for matvec (a
shared-memory slice a warp, 1.0-1.2x) and matmul (16 x 16 shared tiles,
about 1.0x: the L1 cache serves the naive reference as well) fall short of
the 1.5x target, which there asks for more (more loads in flight, register
or tensor-core tiling).

Only the functions that make data (`arrays`, `expected`, `tolerance`)
import numpy, so the statements, the sources and the self-check work
without it.
"""

import random

LEVELS = {1: "vector", 2: "reduction", 3: "matrix"}
# Speedup over the reference that earns the top tier, by level. At level 1
# the reference already streams memory at the GPU's bandwidth in the fixed
# geometry, so matching it (within timing noise) is the top there.
AS_FAST = 0.9
TARGET = {1: AS_FAST, 2: 1.5, 3: 1.5}


def _pow2_range(lo, hi):
    return f"[2^{lo.bit_length() - 1}, 2^{hi.bit_length() - 1}]"


# Helpers the faster kernels share (each answer is compiled alone, so each
# source carries its own copy).
BLOCK_SUM = r"""
__device__ float block_sum_256(float v) {
    __shared__ float warp_part[8];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    v = lane < 8 ? warp_part[lane] : 0.0f;
    if (warp == 0)
        for (int off = 4; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;  // the block's sum, in thread 0
}
"""

ATOMIC_MAX = r"""
__device__ void atomic_max_float(float* addr, float v) {
    int* p = (int*)addr;
    int old = __float_as_int(*(volatile float*)addr);
    while (v > __int_as_float(old)) {
        int seen = atomicCAS(p, old, __float_as_int(v));
        if (seen == old) break;
        old = seen;
    }
}
"""


class Task:
    """One kernel task. `params` is a list of (kind, name, meaning), kind
    one of in, out, inout (float arrays on the GPU), int, float (scalars)."""

    def __init__(self, index, name, level, title, what, params, geometry_text, sizes_text, tolerance_text,
                 reference, wrong, fast=None, init_text=""):
        self.index, self.name, self.level, self.title, self.what = index, name, level, title, what
        self.params, self.geometry_text, self.sizes_text = params, geometry_text, sizes_text
        self.tolerance_text, self.init_text = tolerance_text, init_text
        self.reference, self.wrong, self.fast = reference, wrong, fast
        self.target = TARGET[level]

    def signature(self):
        ctype = {"in": "const float*", "out": "float*", "inout": "float*", "int": "int", "float": "float"}
        args = ", ".join(f"{ctype[k]} {n}" for k, n, _ in self.params)
        return f'extern "C" __global__ void {self.name}({args})'

    # Overridden per task.
    def sizes(self, seed):
        raise NotImplementedError

    def geometry(self, s):
        """(grid, block) for sizes s."""
        raise NotImplementedError

    def shapes(self, s):
        """The element count of each array parameter."""
        raise NotImplementedError

    def arrays(self, s, rng):
        raise NotImplementedError

    def expected(self, s, a):
        raise NotImplementedError

    def tolerance(self, s, a):
        """Per-element allowed |got - expected| of each output (float64)."""
        raise NotImplementedError

    def init(self, s, a):
        """The output arrays' contents before each launch: name -> array,
        or None for an output the server fills with NaN (the kernel writes
        all of it)."""
        return {}

    def rng(self, seed, variant=0):
        import numpy as np

        return np.random.default_rng([self.index, seed, variant])

    def _rand(self, seed):
        return random.Random(f"kernel-task-{self.index}-seed-{seed}")

    def statement(self, seed):
        s = self.sizes(seed)
        grid, block = self.geometry(s)
        inst = ", ".join(f"{k} = {v}" for k, v in s.items())
        lines = [
            "Write a CUDA kernel.",
            "",
            f"Task: {self.title} (level {self.level} of 3, {LEVELS[self.level]}).",
            self.what,
            "",
            "Its signature, exactly:",
            f"    {self.signature()}",
        ]
        lines += [f"- `{n}`: {m}" for _, n, m in self.params]
        lines += [
            "All arrays are float32 in GPU global memory, row-major, each its own allocation (they do not overlap).",
            "",
            f"Launch: the server launches it with {self.geometry_text}; for this instance gridDim = "
            f"({grid[0]}, {grid[1]}, {grid[2]}), blockDim = ({block[0]}, {block[1]}, {block[2]}), "
            "no dynamic shared memory, on the default stream. Your kernel must work with exactly this launch "
            "(it may leave threads idle).",
        ]
        if self.init_text:
            lines.append(self.init_text)
        lines += [
            f"This instance: {inst} ({self.sizes_text}; inputs are random).",
            f"Correct means: {self.tolerance_text}",
            "",
            "Scoring: it is compiled, run once and checked against a reference, then timed (median of up to 20 "
            "launches, CUDA events) beside the server's own straightforward reference kernel, and checked again "
            "on fresh inputs. Reward tiers: 0 no code or a compile error; 0.1 compiled but missing, crashing, "
            "timing out or wrong; 0.6 correct; 0.8 correct and at least as fast as the reference "
            f"(speedup >= {AS_FAST}); 1.0 correct with speedup >= {self.target} (this ends the episode). "
            "You may answer again after each result to improve it: your best tier counts.",
            "",
            "Answer with one fenced code block ```cuda ... ``` holding the kernel and any __device__ helpers it "
            "uses; everything outside the block is ignored. The block is compiled alone as one file (no host "
            "code, no main, do not rely on #include; CUDA's built-ins such as atomicAdd, __shfl_down_sync, "
            "__syncthreads, fmaxf are available). Its form:",
            "",
            "```cuda",
            self.signature(),
            "{",
            "    // your code",
            "}",
            "```",
        ]
        return "\n".join(lines)


# ---------------------------------------------------------------- level 1
class Elementwise(Task):
    LO, HI = 1 << 20, 1 << 24

    def sizes(self, seed):
        return {"n": self._rand(seed).randint(self.LO, self.HI)}

    def geometry(self, s):
        return ((s["n"] + 255) // 256, 1, 1), (256, 1, 1)

    def tolerance(self, s, a):
        import numpy as np

        return {o: 1e-5 * np.abs(e) + 1e-6 for o, e in self.expected(s, a).items()}


class VectorAdd(Elementwise):
    def shapes(self, s):
        return {"a": s["n"], "b": s["n"], "c": s["n"]}

    def arrays(self, s, rng):
        return {k: rng.uniform(-1, 1, s["n"]).astype("float32") for k in ("a", "b")}

    def expected(self, s, a):
        return {"c": a["a"].astype("float64") + a["b"]}


class Saxpy(Elementwise):
    def sizes(self, seed):
        r = self._rand(seed)
        return {"n": r.randint(self.LO, self.HI), "a": round(r.uniform(-2, 2), 4)}

    def shapes(self, s):
        return {"x": s["n"], "y": s["n"]}

    def arrays(self, s, rng):
        return {k: rng.uniform(-1, 1, s["n"]).astype("float32") for k in ("x", "y")}

    def expected(self, s, a):
        import numpy as np

        return {"y": np.float64(np.float32(s["a"])) * a["x"] + a["y"]}

    def init(self, s, a):
        return {"y": a["y"]}


class Relu(Elementwise):
    def shapes(self, s):
        return {"x": s["n"], "y": s["n"]}

    def arrays(self, s, rng):
        return {"x": rng.uniform(-1, 1, s["n"]).astype("float32")}

    def expected(self, s, a):
        import numpy as np

        return {"y": np.maximum(a["x"], 0).astype("float64")}


# ---------------------------------------------------------------- level 2
class Reduction(Task):
    LO, HI = 1 << 20, 1 << 22

    def sizes(self, seed):
        return {"n": self._rand(seed).randint(self.LO, self.HI)}

    def geometry(self, s):
        return ((s["n"] + 255) // 256, 1, 1), (256, 1, 1)

    def init(self, s, a):
        import numpy as np

        return {"out": np.zeros(1, "float32")}


class ReduceSum(Reduction):
    def shapes(self, s):
        return {"x": s["n"], "out": 1}

    def arrays(self, s, rng):
        return {"x": rng.uniform(-1, 1, s["n"]).astype("float32")}

    def expected(self, s, a):
        return {"out": a["x"].astype("float64").sum(keepdims=True)}

    def tolerance(self, s, a):
        import numpy as np

        return {"out": 1e-6 * np.abs(a["x"]).astype("float64").sum(keepdims=True)}


class ReduceMax(Reduction):
    def shapes(self, s):
        return {"x": s["n"], "out": 1}

    def arrays(self, s, rng):
        # Odd seeds: all values negative (a sign trick on the bits fails there).
        lo, hi = (-1000, -1) if s["values"] == "all negative" else (-1000, 1000)
        return {"x": rng.uniform(lo, hi, s["n"]).astype("float32")}

    def sizes(self, seed):
        values = "all negative" if seed % 2 else "of either sign"
        return {"n": self._rand(seed).randint(self.LO, self.HI), "values": values}

    def expected(self, s, a):
        return {"out": a["x"].max(keepdims=True).astype("float64")}

    def tolerance(self, s, a):
        import numpy as np

        return {"out": np.zeros(1)}

    def init(self, s, a):
        import numpy as np

        return {"out": np.full(1, -np.inf, "float32")}


class Dot(Reduction):
    def shapes(self, s):
        return {"a": s["n"], "b": s["n"], "out": 1}

    def arrays(self, s, rng):
        return {k: rng.uniform(-1, 1, s["n"]).astype("float32") for k in ("a", "b")}

    def expected(self, s, a):
        return {"out": (a["a"].astype("float64") * a["b"]).sum(keepdims=True)}

    def tolerance(self, s, a):
        import numpy as np

        return {"out": 1e-6 * np.abs(a["a"].astype("float64") * a["b"]).sum(keepdims=True)}


# ---------------------------------------------------------------- level 3
class Transpose(Task):
    def sizes(self, seed):
        r = self._rand(seed)
        return {"rows": r.randint(1024, 4096), "cols": r.randint(1024, 4096)}

    def geometry(self, s):
        return ((s["cols"] + 31) // 32, (s["rows"] + 31) // 32, 1), (32, 8, 1)

    def shapes(self, s):
        return {"in": s["rows"] * s["cols"], "out": s["rows"] * s["cols"]}

    def arrays(self, s, rng):
        return {"in": rng.uniform(-1, 1, s["rows"] * s["cols"]).astype("float32")}

    def expected(self, s, a):
        m = a["in"].reshape(s["rows"], s["cols"])
        return {"out": m.T.astype("float64").ravel()}

    def tolerance(self, s, a):
        import numpy as np

        return {"out": np.zeros(1)}


class Matvec(Task):
    def sizes(self, seed):
        r = self._rand(seed)
        return {"m": r.randint(16384, 65536), "n": r.randint(256, 1024)}

    def geometry(self, s):
        return ((s["m"] + 255) // 256, 1, 1), (256, 1, 1)

    def shapes(self, s):
        return {"A": s["m"] * s["n"], "x": s["n"], "y": s["m"]}

    def arrays(self, s, rng):
        return {"A": rng.uniform(-1, 1, s["m"] * s["n"]).astype("float32"),
                "x": rng.uniform(-1, 1, s["n"]).astype("float32")}

    def expected(self, s, a):
        A = a["A"].reshape(s["m"], s["n"]).astype("float64")
        return {"y": A @ a["x"].astype("float64")}

    def tolerance(self, s, a):
        import numpy as np

        A = np.abs(a["A"].reshape(s["m"], s["n"]))
        return {"y": 2e-4 * (A @ np.abs(a["x"])).astype("float64") + 1e-5}


class Matmul(Task):
    def sizes(self, seed):
        r = self._rand(seed)
        return {"m": r.randint(512, 2048), "n": r.randint(512, 2048), "k": r.randint(512, 2048)}

    def geometry(self, s):
        return ((s["n"] + 15) // 16, (s["m"] + 15) // 16, 1), (16, 16, 1)

    def shapes(self, s):
        return {"A": s["m"] * s["k"], "B": s["k"] * s["n"], "C": s["m"] * s["n"]}

    def arrays(self, s, rng):
        return {"A": rng.uniform(-1, 1, s["m"] * s["k"]).astype("float32"),
                "B": rng.uniform(-1, 1, s["k"] * s["n"]).astype("float32")}

    def expected(self, s, a):
        A = a["A"].reshape(s["m"], s["k"]).astype("float64")
        B = a["B"].reshape(s["k"], s["n"]).astype("float64")
        return {"C": (A @ B).ravel()}

    def tolerance(self, s, a):
        import numpy as np

        A = np.abs(a["A"].reshape(s["m"], s["k"]))
        B = np.abs(a["B"].reshape(s["k"], s["n"]))
        return {"C": (1e-3 * (A @ B)).astype("float64").ravel() + 1e-5}


ELEMENTWISE_TOL = "every element within 1e-5 * |expected| + 1e-6 of numpy's float64 result."
REDUCTION_TOL = "out[0] within 1e-6 * (the sum of the terms' absolute values) of numpy's float64 result."
GEOM_1D = "blockDim = (256, 1, 1) and gridDim = (ceil(n / 256), 1, 1)"

TASKS = [
    VectorAdd(
        0, "vector_add", 1, "vector addition", "Compute c[i] = a[i] + b[i] for 0 <= i < n.",
        [("in", "a", "input, n floats"), ("in", "b", "input, n floats"), ("out", "c", "output, n floats"),
         ("int", "n", "the element count")],
        GEOM_1D, f"n ranges over {_pow2_range(1 << 20, 1 << 24)} across instances", ELEMENTWISE_TOL,
        reference=r"""
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
""",
        wrong=r"""
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] - b[i];
}
""",
    ),
    Saxpy(
        1, "saxpy", 1, "saxpy", "Compute y[i] = a * x[i] + y[i] for 0 <= i < n, in place.",
        [("int", "n", "the element count"), ("float", "a", "the scale"), ("in", "x", "input, n floats"),
         ("inout", "y", "input and output, n floats, updated in place")],
        GEOM_1D, f"n ranges over {_pow2_range(1 << 20, 1 << 24)} across instances, a over [-2, 2]", ELEMENTWISE_TOL,
        reference=r"""
extern "C" __global__ void saxpy(int n, float a, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
""",
        wrong=r"""
extern "C" __global__ void saxpy(int n, float a, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
""",
        init_text="y holds its input values before every launch.",
    ),
    Relu(
        2, "relu", 1, "ReLU", "Compute y[i] = max(x[i], 0) for 0 <= i < n.",
        [("in", "x", "input, n floats"), ("out", "y", "output, n floats"), ("int", "n", "the element count")],
        GEOM_1D, f"n ranges over {_pow2_range(1 << 20, 1 << 24)} across instances", ELEMENTWISE_TOL,
        reference=r"""
extern "C" __global__ void relu(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
""",
        wrong=r"""
extern "C" __global__ void relu(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fabsf(x[i]);
}
""",
    ),
    ReduceSum(
        3, "reduce_sum", 2, "sum reduction", "Compute out[0] = x[0] + x[1] + ... + x[n-1].",
        [("in", "x", "input, n floats in [-1, 1)"), ("out", "out", "output, one float"),
         ("int", "n", "the element count")],
        GEOM_1D, f"n ranges over {_pow2_range(1 << 20, 1 << 22)} across instances", REDUCTION_TOL,
        init_text="out[0] is set to 0.0f before every launch; atomicAdd on it is allowed (blocks may add partial sums).",
        reference=r"""
extern "C" __global__ void reduce_sum(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(out, x[i]);
}
""",
        wrong=r"""
extern "C" __global__ void reduce_sum(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n / 2) atomicAdd(out, x[i]);
}
""",
        fast=BLOCK_SUM + r"""
extern "C" __global__ void reduce_sum(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = block_sum_256(i < n ? x[i] : 0.0f);
    if (threadIdx.x == 0) atomicAdd(out, s);
}
""",
    ),
    ReduceMax(
        4, "reduce_max", 2, "max reduction", "Compute out[0] = the largest of x[0], ..., x[n-1].",
        [("in", "x", "input, n finite floats in [-1000, 1000)"), ("out", "out", "output, one float"),
         ("int", "n", "the element count")],
        GEOM_1D, f"n ranges over {_pow2_range(1 << 20, 1 << 22)} across instances; in some instances all values "
        "are negative", "out[0] equal to the largest element, exactly.",
        init_text="out[0] is set to -INFINITY before every launch; atomic operations on it are allowed (CUDA has no "
        "float atomicMax: an atomicCAS loop on its bits works for either sign).",
        reference=ATOMIC_MAX + r"""
extern "C" __global__ void reduce_max(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomic_max_float(out, x[i]);
}
""",
        wrong=ATOMIC_MAX + r"""
extern "C" __global__ void reduce_max(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomic_max_float(out, -x[i]);
}
""",
        fast=ATOMIC_MAX + r"""
extern "C" __global__ void reduce_max(const float* x, float* out, int n) {
    __shared__ float warp_part[8];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : -INFINITY;
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < 8 ? warp_part[lane] : -INFINITY;
        for (int off = 4; off > 0; off >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
        if (lane == 0) atomic_max_float(out, v);
    }
}
""",
    ),
    Dot(
        5, "dot", 2, "dot product", "Compute out[0] = a[0]*b[0] + a[1]*b[1] + ... + a[n-1]*b[n-1].",
        [("in", "a", "input, n floats in [-1, 1)"), ("in", "b", "input, n floats in [-1, 1)"),
         ("out", "out", "output, one float"), ("int", "n", "the element count")],
        GEOM_1D, f"n ranges over {_pow2_range(1 << 20, 1 << 22)} across instances", REDUCTION_TOL,
        init_text="out[0] is set to 0.0f before every launch; atomicAdd on it is allowed (blocks may add partial sums).",
        reference=r"""
extern "C" __global__ void dot(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(out, a[i] * b[i]);
}
""",
        wrong=r"""
extern "C" __global__ void dot(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(out, a[i] + b[i]);
}
""",
        fast=BLOCK_SUM + r"""
extern "C" __global__ void dot(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float s = block_sum_256(i < n ? a[i] * b[i] : 0.0f);
    if (threadIdx.x == 0) atomicAdd(out, s);
}
""",
    ),
    Transpose(
        6, "transpose", 3, "matrix transpose",
        "`in` is a rows x cols matrix; write its transpose, a cols x rows matrix, to `out`: "
        "out[j * rows + i] = in[i * cols + j] for 0 <= i < rows, 0 <= j < cols.",
        [("in", "in", "input, rows * cols floats"), ("out", "out", "output, cols * rows floats"),
         ("int", "rows", "the input's row count"), ("int", "cols", "the input's column count")],
        "blockDim = (32, 8, 1) and gridDim = (ceil(cols / 32), ceil(rows / 32), 1): block (bx, by) naturally owns "
        "the 32 x 32 tile of `in` at rows 32*by.., columns 32*bx.., four elements a thread",
        "rows and cols each range over [1024, 4096], not multiples of 32", "every element exactly equal.",
        reference=r"""
extern "C" __global__ void transpose(const float* in, float* out, int rows, int cols) {
    int col = blockIdx.x * 32 + threadIdx.x;
    for (int r = threadIdx.y; r < 32; r += 8) {
        int row = blockIdx.y * 32 + r;
        if (row < rows && col < cols) out[(size_t)col * rows + row] = in[(size_t)row * cols + col];
    }
}
""",
        wrong=r"""
extern "C" __global__ void transpose(const float* in, float* out, int rows, int cols) {
    int col = blockIdx.x * 32 + threadIdx.x;
    for (int r = threadIdx.y; r < 32; r += 8) {
        int row = blockIdx.y * 32 + r;
        if (row < rows && col < cols) out[(size_t)row * cols + col] = in[(size_t)row * cols + col];
    }
}
""",
        fast=r"""
extern "C" __global__ void transpose(const float* in, float* out, int rows, int cols) {
    __shared__ float tile[32][33];
    int x = blockIdx.x * 32 + threadIdx.x, y0 = blockIdx.y * 32;
    for (int r = threadIdx.y; r < 32; r += 8)
        if (y0 + r < rows && x < cols) tile[r][threadIdx.x] = in[(size_t)(y0 + r) * cols + x];
    __syncthreads();
    int ox = y0 + threadIdx.x;  // a column of out: a row of in
    for (int r = threadIdx.y; r < 32; r += 8) {
        int oy = blockIdx.x * 32 + r;  // a row of out: a column of in
        if (oy < cols && ox < rows) out[(size_t)oy * rows + ox] = tile[threadIdx.x][r];
    }
}
""",
    ),
    Matvec(
        7, "matvec", 3, "matrix-vector product",
        "Compute y = A x: y[i] = sum over j of A[i * n + j] * x[j], for 0 <= i < m (A is m x n).",
        [("in", "A", "input, m * n floats (m x n)"), ("in", "x", "input, n floats"), ("out", "y", "output, m floats"),
         ("int", "m", "A's row count"), ("int", "n", "A's column count")],
        "blockDim = (256, 1, 1) and gridDim = (ceil(m / 256), 1, 1): block b naturally owns rows 256*b .. 256*b+255",
        "m ranges over [16384, 65536], n over [256, 1024]",
        "every y[i] within 2e-4 * (sum over j of |A[i,j] * x[j]|) + 1e-5 of numpy's float64 result.",
        reference=r"""
extern "C" __global__ void matvec(const float* A, const float* x, float* y, int m, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m) {
        const float* row = A + (size_t)i * n;
        float s = 0.0f;
        for (int j = 0; j < n; ++j) s += row[j] * x[j];
        y[i] = s;
    }
}
""",
        wrong=r"""
extern "C" __global__ void matvec(const float* A, const float* x, float* y, int m, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m) {
        float s = 0.0f;
        for (int j = 0; j < n; ++j) s += A[(size_t)j * n + i % n] * x[j];
        y[i] = s;
    }
}
""",
        fast=r"""
extern "C" __global__ void matvec(const float* A, const float* x, float* y, int m, int n) {
    // Each warp owns 32 rows. For each 32-column slice its lanes load the
    // 32 x 32 block row by row (coalesced, 32 loads in flight), times x,
    // into shared memory; then lane l adds up row l's slice.
    __shared__ float tile[8][32][33];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int base = blockIdx.x * 256 + warp * 32;
    float s = 0.0f;
    for (int c0 = 0; c0 < n; c0 += 32) {
        int c = c0 + lane;
        float xc = c < n ? x[c] : 0.0f;
#pragma unroll
        for (int r = 0; r < 32; ++r) {
            int row = base + r;
            tile[warp][r][lane] = (row < m && c < n) ? A[(size_t)row * n + c] * xc : 0.0f;
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 32; ++j) s += tile[warp][lane][j];
        __syncwarp();
    }
    if (base + lane < m) y[base + lane] = s;
}
""",
    ),
    Matmul(
        8, "matmul", 3, "matrix-matrix product",
        "Compute C = A B: C[i * n + j] = sum over t of A[i * k + t] * B[t * n + j] (A is m x k, B is k x n, "
        "C is m x n).",
        [("in", "A", "input, m * k floats"), ("in", "B", "input, k * n floats"), ("out", "C", "output, m * n floats"),
         ("int", "m", "rows of A and C"), ("int", "n", "columns of B and C"), ("int", "k", "columns of A, rows of B")],
        "blockDim = (16, 16, 1) and gridDim = (ceil(n / 16), ceil(m / 16), 1): thread (tx, ty) of block (bx, by) "
        "naturally owns C[16*by + ty][16*bx + tx]",
        "m, n and k each range over [512, 2048]",
        "every C[i,j] within 1e-3 * (sum over t of |A[i,t] * B[t,j]|) + 1e-5 of numpy's float64 result "
        "(TF32 tensor cores fit).",
        reference=r"""
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int m, int n, int k) {
    int col = blockIdx.x * 16 + threadIdx.x, row = blockIdx.y * 16 + threadIdx.y;
    if (row < m && col < n) {
        float s = 0.0f;
        for (int t = 0; t < k; ++t) s += A[(size_t)row * k + t] * B[(size_t)t * n + col];
        C[(size_t)row * n + col] = s;
    }
}
""",
        wrong=r"""
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int m, int n, int k) {
    int col = blockIdx.x * 16 + threadIdx.x, row = blockIdx.y * 16 + threadIdx.y;
    if (row < m && col < n) {
        float s = 0.0f;
        for (int t = 0; t < k; ++t) s += A[(size_t)row * k + t] * B[(size_t)col * k + t];
        C[(size_t)row * n + col] = s;
    }
}
""",
        fast=r"""
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int m, int n, int k) {
    __shared__ float As[16][17], Bs[16][17];
    int tx = threadIdx.x, ty = threadIdx.y;
    int col = blockIdx.x * 16 + tx, row = blockIdx.y * 16 + ty;
    float s = 0.0f;
    for (int t0 = 0; t0 < k; t0 += 16) {
        As[ty][tx] = (row < m && t0 + tx < k) ? A[(size_t)row * k + t0 + tx] : 0.0f;
        Bs[ty][tx] = (t0 + ty < k && col < n) ? B[(size_t)(t0 + ty) * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < 16; ++t) s += As[ty][t] * Bs[t][tx];
        __syncthreads();
    }
    if (row < m && col < n) C[(size_t)row * n + col] = s;
}
""",
    ),
]


def task_of(data_idx):
    """(task, seed) of a data index: task k mod 9, seed k div 9."""
    return TASKS[data_idx % len(TASKS)], data_idx // len(TASKS)


def syntax_error(source):
    """The source with a statement that does not parse, for the tests."""
    head, brace, tail = source.rpartition(") {")
    return head + brace + "\n    float broken = ;" + tail
