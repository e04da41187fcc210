// Token sampling on the device (see src/model/generate.rs): one block a row of
// logits picks the next token and its log-probability, so only two numbers a
// row leave the device instead of the whole row.
//
// Per row, with z = (x - max) / temperature:
//   - the log-probability of the token is z[t] - log(sum(exp(z))), over the
//     whole vocabulary, before any truncation (what a trainer computes);
//   - top-k and top-p become one threshold on the logits: tokens whose logit
//     is at least it are kept. It is found by bisection on the 32 bits of an
//     order-preserving integer image of the logit (32 passes over the row for
//     top-k, 32 for top-p), so no sort of the vocabulary is needed. Tokens
//     tied with the threshold are all kept;
//   - the draw is the Gumbel-max trick (Gumbel 1954; Maddison et al. 2014,
//     "A* Sampling", sec. 2): argmax over kept tokens of z + G with G
//     standard Gumbel noise, which picks each kept token with its
//     renormalised probability. The noise of token i is a hash of (the row's
//     seed, i), so a seed gives the same token on every run and a row's draw
//     depends on nothing but its own logits and seed.
// Temperature 0 (inv_temp == 0) picks the most likely token (the lowest id
// among ties) with the log-probability of the raw logits.
//
// Every row has its own settings (a server's requests each ask their own):
// `params` holds 3 b words for b rows, [inv_temp (f32 bits) a row | top_k a
// row | top_p (f32 bits) a row]. `draw_like_device` in src/model/generate.rs
// is this rule on the host, step for step.

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

// Standard Gumbel noise for token i of a row with this seed, from a uniform
// in (0, 1) with 53 bits (double, so that -log(-log(u)) stays finite).
__device__ __forceinline__ float gumbel(uint64_t seed, uint32_t i) {
    const uint64_t h = mix64(seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull);
    const double u = ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return (float)(-log(-log(u)));
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

// One block a row of v logits. out[2 row] = the token, out[2 row + 1] = the
// bits of its f32 log-probability (one buffer, one copy to the host).
template <typename T>
__device__ void sample_rows(const T *logits, int v, const uint64_t *seeds, const uint32_t *params,
                            uint32_t *out) {
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
        const float score = greedy ? xi : (xi - m) * scale + gumbel(seed, (uint32_t)i);
        better(best, arg, score, (uint32_t)i);
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
    extern "C" __global__ void sample_rows_##NAME(const T *logits, int v, const uint64_t *seeds,  \
                                                  const uint32_t *params, uint32_t *out) {        \
        sample_rows<T>(logits, v, seeds, params, out);                                            \
    }

INSTANTIATE(f32, float)
INSTANTIATE(bf16, __nv_bfloat16)
INSTANTIATE(f16, __half)
