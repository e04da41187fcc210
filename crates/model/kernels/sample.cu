// Token sampling on the device (see src/model/draw.rs): each row of logits
// yields its next token and that token's log-probability on the device, so
// only two numbers a row reach the host, not the whole row.
//
// For each row, with z = (x - max) / temperature:
//   - the token's log-probability is z[t] - log(sum(exp(z))) over the whole
//     vocabulary, before any truncation (what a trainer computes);
//   - top-k and top-p reduce to one threshold on the logits: a token is
//     kept when its logit is at or above it. The threshold is found by
//     bisection on the 32 bits of an order-preserving integer image of the
//     logit (32 passes over the row for top-k, 32 for top-p), so the
//     vocabulary is never sorted. Tokens tied with the threshold are all
//     kept;
//   - the draw uses the Gumbel-max trick (Gumbel 1954; Maddison et al. 2014,
//     "A* Sampling", sec. 2): the argmax over kept tokens of z + G, G
//     standard Gumbel noise, picks each kept token with its renormalised
//     probability; x / temperature + G has the same argmax and is what is
//     compared. Token i's noise is a hash of (the row's seed, i): a seed
//     gives the same token on every run, and a row's draw depends only on
//     its own logits and seed.
// Temperature 0 (inv_temp == 0) takes the most likely token (the lowest id
// among ties) with the log-probability of the raw logits.
//
// A row that cuts nothing (the common case) is spread over several blocks
// (sample_slices) whose results one thread merges (sample_rows): one block
// a row left most of a large GPU idle. A row with top-k or top-p is drawn by
// one block over the whole row.
//
// Each row carries its own settings, since a server's requests each choose
// theirs: `params` holds 3 b words for b rows, [inv_temp (f32 bits) a row |
// top_k a row | top_p (f32 bits) a row]. `device_rule` in src/model/draw.rs
// applies the same rule on the host, step for step.

#include "common.cuh"

// Monotone map of floats to unsigned integers: a < b iff key(a) < key(b).
__device__ __forceinline__ uint32_t key_of(float f) {
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// SplitMix64's finaliser (Steele et al. 2014): a well-mixed 64-bit hash.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Standard Gumbel noise for token i of a row with this seed: G = -log(E),
// E = -log(u) a standard exponential, u = (k + 1/2) / 2^32 from 32 bits k
// of the hash. Above u = 1/2, log(u) is taken as log1p(-(1 - u)) with 1 - u
// formed exactly from the complement of k, so E keeps its relative
// precision at both ends and G stays finite (within [-3.2, 22.9], GUMBEL_MAX
// above). In f32: the f64 logarithms this replaced made the sampling
// kernel 0.24 ms of a 6 ms Qwen3-4B decode step.
#define GUMBEL_MAX 23.f
__device__ __forceinline__ float gumbel(uint64_t seed, uint32_t i) {
    const uint64_t h = mix64(seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull);
    const uint32_t k = (uint32_t)(h >> 32);
    const float e = k < 0x80000000u ? -logf(((float)k + 0.5f) * 0x1p-32f)
                                    : -log1pf(-(((float)(0xffffffffu - k) + 0.5f) * 0x1p-32f));
    return -logf(e);
}

// A token's noisy score: the logit itself when greedy, else x * scale + G
// (one fma). The shift by the row's max that z carries changes no argmax,
// so it is left out and every slice of a row scores alike.
__device__ __forceinline__ float score_of(float x, bool greedy, float scale, uint64_t seed, uint32_t i) {
    return greedy ? x : fmaf(x, scale, gumbel(seed, i));
}

// The better of two (score, index) pairs: the higher score, then the lower index.
__device__ __forceinline__ void better(float &s, uint32_t &i, float s2, uint32_t i2) {
    if (s2 > s || (s2 == s && i2 < i)) { s = s2; i = i2; }
}

// The block's best pair; every thread gets it.
__device__ __forceinline__ uint32_t block_argmax(float s, uint32_t i, float *fs, uint32_t *is) {
    for (int o = 16; o > 0; o >>= 1) {
        const float s2 = __shfl_xor_sync(0xffffffff, s, o);
        const uint32_t i2 = __shfl_xor_sync(0xffffffff, i, o);
        better(s, i, s2, i2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { fs[warp] = s; is[warp] = i; }
    __syncthreads();
    const int warps = blockDim.x >> 5;
    s = lane < warps ? fs[lane] : -INFINITY;
    i = lane < warps ? is[lane] : 0xffffffffu;
    for (int o = 16; o > 0; o >>= 1) {
        const float s2 = __shfl_xor_sync(0xffffffff, s, o);
        const uint32_t i2 = __shfl_xor_sync(0xffffffff, i, o);
        better(s, i, s2, i2);
    }
    return i;
}

// Whether a row's settings cut the vocabulary (top-k or top-p): such a
// row is drawn by one block over the whole row (sample_rows); every other
// row by slices (sample_slices, then the merge in sample_rows).
__device__ __forceinline__ bool cuts(const uint32_t *params, size_t row, size_t b, int v) {
    const float inv_temp = __uint_as_float(params[row]);
    const int top_k = (int)params[b + row];
    const float top_p = __uint_as_float(params[2 * b + row]);
    return inv_temp != 0.f && ((top_k > 0 && top_k < v) || top_p < 1.f);
}

// Slice s of a row that cuts nothing: part[(row * S + s) * 4 ..] = its
// largest logit m, sum of exp((x - m) * scale), best score and that
// token. A token whose score could not reach the best so far even with
// the largest noise skips the noise (exact: fma is monotone in its
// addend). Grid (B, S), block a multiple of 32.
template <typename T>
__device__ void sample_slices(const T *logits, int v, const uint64_t *seeds, const uint32_t *params,
                              float *part) {
    __shared__ float fs[32];
    __shared__ uint32_t us[32];
    const size_t row = blockIdx.x, b = gridDim.x;
    const int slices = gridDim.y, s = blockIdx.y;
    if (cuts(params, row, b, v)) return;
    const float inv_temp = __uint_as_float(params[row]);
    const bool greedy = inv_temp == 0.f;
    const float scale = greedy ? 1.f : inv_temp;
    const int per = (v + slices - 1) / slices;
    const int lo = s * per, hi = min(v, lo + per);
    const T *x = logits + row * (size_t)v;
    const uint64_t seed = seeds[row];
    float m = -INFINITY;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) m = fmaxf(m, to_f(x[i]));
    m = block_max(m, fs);
    float sum = 0.f, best = -INFINITY;
    uint32_t arg = 0xffffffffu;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float xi = to_f(x[i]);
        if (m != -INFINITY) sum += __expf((xi - m) * scale);
        if (!greedy && fmaf(xi, scale, GUMBEL_MAX) < best) continue;
        better(best, arg, score_of(xi, greedy, scale, seed, (uint32_t)i), (uint32_t)i);
    }
    sum = block_sum(sum, fs);
    __shared__ float bs[32];
    arg = block_argmax(best, arg, bs, us);
    // block_argmax gives every thread the index; the score is the row's own.
    if (threadIdx.x == 0) {
        float *p = part + (row * slices + s) * 4;
        p[0] = m;
        p[1] = sum;
        p[2] = arg < (uint32_t)v ? score_of(to_f(x[arg]), greedy, scale, seed, arg) : -INFINITY;
        p[3] = __uint_as_float(arg);
    }
}

// One block a row of v logits. out[2 row] = the token, out[2 row + 1] = the
// bits of its f32 log-probability (one buffer, one copy to the host). A row
// that cuts nothing merges its `slices` slices from `part` (sample_slices,
// launched before); one that cuts is drawn here over the whole row.
template <typename T>
__device__ void sample_rows(const T *logits, int v, const uint64_t *seeds, const uint32_t *params,
                            const float *part, int slices, uint32_t *out) {
    __shared__ float fs[32];
    __shared__ uint32_t us[32];
    const size_t row = blockIdx.x;
    const size_t b = gridDim.x;
    const float inv_temp = __uint_as_float(params[row]);
    const int top_k = (int)params[b + row];
    const float top_p = __uint_as_float(params[2 * b + row]);
    const T *x = logits + row * (size_t)v;
    const bool greedy = inv_temp == 0.f;
    const float scale = greedy ? 1.f : inv_temp;

    if (!cuts(params, row, b, v)) {
        if (threadIdx.x != 0) return;
        const float *p = part + row * (size_t)slices * 4;
        float m = -INFINITY, best = -INFINITY;
        uint32_t arg = 0xffffffffu;
        for (int j = 0; j < slices; ++j) {
            m = fmaxf(m, p[4 * j]);
            better(best, arg, p[4 * j + 2], __float_as_uint(p[4 * j + 3]));
        }
        float sum = 0.f;
        for (int j = 0; j < slices; ++j)
            if (p[4 * j] != -INFINITY) sum += p[4 * j + 1] * __expf((p[4 * j] - m) * scale);
        if (arg >= (uint32_t)v) arg = 0; // a row of NaN: nothing compares greater
        out[2 * row] = arg;
        out[2 * row + 1] = __float_as_uint((to_f(x[arg]) - m) * scale - logf(sum));
        return;
    }

    float m = -INFINITY;
    for (int i = threadIdx.x; i < v; i += blockDim.x) m = fmaxf(m, to_f(x[i]));
    m = block_max(m, fs);
    float s = 0.f;
    for (int i = threadIdx.x; i < v; i += blockDim.x) s += __expf((to_f(x[i]) - m) * scale);
    const float lse = logf(block_sum(s, fs));

    // Kept: key_of(logit) >= thr (0 keeps every token).
    uint32_t thr = 0;
    if (!greedy && top_k > 0 && top_k < v) {
        // The largest thr with at least top_k logits at or above it: the
        // top_k-th largest logit.
        for (int bit = 31; bit >= 0; --bit) {
            const uint32_t cand = thr | (1u << bit);
            uint32_t c = 0;
            for (int i = threadIdx.x; i < v; i += blockDim.x) c += key_of(to_f(x[i])) >= cand;
            if (block_sum(c, us) >= (uint32_t)top_k) thr = cand;
        }
    }
    if (!greedy && top_p < 1.f) {
        // The largest cut whose kept tokens (at or above both cuts) still hold
        // top_p of the mass that top-k kept.
        float kept = 0.f;
        for (int i = threadIdx.x; i < v; i += blockDim.x) {
            const float xi = to_f(x[i]);
            if (key_of(xi) >= thr) kept += __expf((xi - m) * scale);
        }
        const float target = top_p * block_sum(kept, fs);
        uint32_t cut = 0;
        for (int bit = 31; bit >= 0; --bit) {
            const uint32_t cand = cut | (1u << bit);
            const uint32_t lo = cand > thr ? cand : thr;
            float mass = 0.f;
            for (int i = threadIdx.x; i < v; i += blockDim.x) {
                const float xi = to_f(x[i]);
                if (key_of(xi) >= lo) mass += __expf((xi - m) * scale);
            }
            if (block_sum(mass, fs) >= target) cut = cand;
        }
        if (cut > thr) thr = cut;
    }

    float best = -INFINITY;
    uint32_t arg = 0xffffffffu;
    const uint64_t seed = seeds[row];
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        const float xi = to_f(x[i]);
        if (key_of(xi) < thr) continue;
        better(best, arg, score_of(xi, greedy, scale, seed, (uint32_t)i), (uint32_t)i);
    }
    __shared__ float bs[32];
    arg = block_argmax(best, arg, bs, us);
    if (threadIdx.x == 0) {
        if (arg >= (uint32_t)v) arg = 0; // a row of NaN: nothing compares greater
        out[2 * row] = arg;
        out[2 * row + 1] = __float_as_uint((to_f(x[arg]) - m) * scale - lse);
    }
}

#define INSTANTIATE(NAME, T)                                                                      \
    extern "C" __global__ void sample_slices_##NAME(const T *logits, int v, const uint64_t *seeds, \
                                                    const uint32_t *params, float *part) {         \
        sample_slices<T>(logits, v, seeds, params, part);                                         \
    }                                                                                             \
    extern "C" __global__ void sample_rows_##NAME(const T *logits, int v, const uint64_t *seeds,  \
                                                  const uint32_t *params, const float *part,      \
                                                  int slices, uint32_t *out) {                    \
        sample_rows<T>(logits, v, seeds, params, part, slices, out);                              \
    }

INSTANTIATE(f32, float)
INSTANTIATE(bf16, __nv_bfloat16)
INSTANTIATE(f16, __half)
