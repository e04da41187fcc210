// Fused kernels of the hand-written decoder-layer backward and the chunked
// lm_head loss (see src/model/fused.rs). Each replaces a chain of candle ops
// that made one pass over memory apiece, in f32, with one pass in the
// model's dtype; the arithmetic is f32 in registers.

#include "common.cuh"

// RMSNorm backward, one block a row of n values: with r = 1/sqrt(mean(x^2) + eps),
// x^ = x r and t = dy w, dx = r (t - x^ mean(t x^)).
template <typename T>
__device__ void rmsnorm_bwd(const T *x, const T *w, const T *dy, T *dx, int n, float eps) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    x += row * n; dy += row * n; dx += row * n;
    float ss = 0.f, tx = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float xv = to_f(x[i]);
        ss += xv * xv;
        tx += to_f(dy[i]) * to_f(w[i]) * xv;
    }
    ss = block_sum(ss, shared);
    tx = block_sum(tx, shared);
    const float r = rsqrtf(ss / n + eps);
    const float c = tx * r * r / n; // mean(t x^) r, applied to x (x^ = x r)
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float t = to_f(dy[i]) * to_f(w[i]);
        dx[i] = from_f<T>(r * (t - to_f(x[i]) * c));
    }
}

// SwiGLU: h = silu(g) u. Backward: du = dh silu(g), dg = dh u s (1 + g (1 - s)).
// silu(g) * u, 8 values a thread where the buffers allow (16-byte loads),
// the same arithmetic for each value as one at a time.
template <typename T>
__device__ void swiglu_fwd(const T *g, const T *u, T *h, size_t numel) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const bool aligned = ((reinterpret_cast<uintptr_t>(g) | reinterpret_cast<uintptr_t>(u) |
                           reinterpret_cast<uintptr_t>(h)) &
                          (8 * sizeof(T) - 1)) == 0;
    size_t done = 0;
    if (aligned) {
        const size_t groups = numel / 8;
        for (size_t k = first; k < groups; k += stride) {
            float gv[8], uv[8], hv[8];
            load8(g + 8 * k, gv);
            load8(u + 8 * k, uv);
#pragma unroll
            for (int e = 0; e < 8; ++e) hv[e] = gv[e] / (1.f + __expf(-gv[e])) * uv[e];
            store8(h + 8 * k, hv);
        }
        done = groups * 8;
    }
    for (size_t i = done + first; i < numel; i += stride) {
        const float gv = to_f(g[i]);
        h[i] = from_f<T>(gv / (1.f + __expf(-gv)) * to_f(u[i]));
    }
}

// RMSNorm forward as candle and the decode step compute it, y = T(x r w)
// with r = 1/sqrt(mean(x^2) + eps), rounded once: one warp a row of n values (n a multiple of
// 8, at most 256 CH), 8 values a load held in registers between the sum
// and the output. candle's kernel gives a 2,560-wide row 1,024 threads of
// 2-byte loads, and a 128-wide one (a head's q/k norm) a warp of them.
template <typename T, int CH>
__device__ void rmsnorm_rows(const T *x, const T *w, T *out, int rows, int n, float eps) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T *xr = x + (size_t)row * n;
    T *o = out + (size_t)row * n;
    float v[CH][8];
    float ss = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int i = (c * 32 + lane) * 8;
        if (i < n) {
            load8(xr + i, v[c]);
#pragma unroll
            for (int e = 0; e < 8; ++e) ss += v[c][e] * v[c][e];
        }
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / (float)n + eps);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int i = (c * 32 + lane) * 8;
        if (i < n) {
            float wv[8], y[8];
            load8(w + i, wv);
#pragma unroll
            for (int e = 0; e < 8; ++e) y[e] = v[c][e] * r * wv[e];
            store8(o + i, y);
        }
    }
}

template <typename T>
__device__ void swiglu_bwd(const T *g, const T *u, const T *dh, T *dg, T *du, size_t numel) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < numel;
         i += (size_t)gridDim.x * blockDim.x) {
        const float gv = to_f(g[i]), uv = to_f(u[i]), d = to_f(dh[i]);
        const float s = 1.f / (1.f + __expf(-gv));
        du[i] = from_f<T>(d * gv * s);
        dg[i] = from_f<T>(d * uv * s * (1.f + gv * (1.f - s)));
    }
}

// Cross-entropy of one row of logits against its target, one block a row of
// v values: loss[row] = logsumexp(z) - z[target], and the row overwritten with
// dL/dz = softmax(z) - onehot(target) (in the logits' dtype).
template <typename T>
__device__ void xent_fwd_bwd(T *z, const uint32_t *target, float *loss, int v) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    z += row * v;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < v; i += blockDim.x) m = fmaxf(m, to_f(z[i]));
    m = block_max(m, shared);
    float s = 0.f;
    for (int i = threadIdx.x; i < v; i += blockDim.x) s += __expf(to_f(z[i]) - m);
    s = block_sum(s, shared);
    const float lse = m + __logf(s);
    const uint32_t t = target[row];
    if (threadIdx.x == 0) loss[row] = lse - to_f(z[t]);
    __syncthreads(); // z[t] read before it is overwritten
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        const float p = __expf(to_f(z[i]) - lse);
        z[i] = from_f<T>((uint32_t)i == t ? p - 1.f : p);
    }
}

// SplitMix64's finaliser (Steele, Lea and Flood 2014): a counter-based
// stream, value i of seed s being mix(s ^ i * odd constant).
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Inverted dropout's mask: element i is 0 with probability p, else keep =
// 1 / (1 - p), from a uniform of 24 bits drawn from (seed, i) alone, so a
// mask repeats exactly whatever the launch shape.
template <typename T>
__device__ void dropout_mask(T *out, size_t numel, uint64_t seed, float p, float keep) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < numel;
         i += (size_t)gridDim.x * blockDim.x) {
        const float u = (float)(mix64(seed ^ (i * 0xd1b54a32d192ed03ull)) >> 40) * 0x1p-24f;
        out[i] = from_f<T>(u < p ? 0.f : keep);
    }
}

// x times the mask dropout_mask draws for the same (seed, p): out[i] = x[i]
// * mask[i], the mask value rounded to T first as a stored mask would be, so
// both give the same bits; no mask is written or read.
template <typename T>
__device__ void dropout_apply(const T *x, T *out, size_t numel, uint64_t seed, float p, float keep) {
    const float kept = to_f(from_f<T>(keep));
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < numel;
         i += (size_t)gridDim.x * blockDim.x) {
        const float u = (float)(mix64(seed ^ (i * 0xd1b54a32d192ed03ull)) >> 40) * 0x1p-24f;
        out[i] = from_f<T>(to_f(x[i]) * (u < p ? 0.f : kept));
    }
}

#define INSTANTIATE(NAME, T)                                                                      \
    extern "C" __global__ void dropout_mask_##NAME(T *out, size_t numel, uint64_t seed, float p,  \
                                                   float keep) {                                  \
        dropout_mask<T>(out, numel, seed, p, keep);                                               \
    }                                                                                             \
    extern "C" __global__ void dropout_apply_##NAME(const T *x, T *out, size_t numel,             \
                                                    uint64_t seed, float p, float keep) {         \
        dropout_apply<T>(x, out, numel, seed, p, keep);                                           \
    }                                                                                             \
    extern "C" __global__ void rmsnorm_bwd_##NAME(const T *x, const T *w, const T *dy, T *dx,     \
                                                  int n, float eps) {                             \
        rmsnorm_bwd<T>(x, w, dy, dx, n, eps);                                                     \
    }                                                                                             \
    extern "C" __global__ void swiglu_fwd_##NAME(const T *g, const T *u, T *h, size_t numel) {    \
        swiglu_fwd<T>(g, u, h, numel);                                                            \
    }                                                                                             \
    extern "C" __global__ void rmsnorm_rows4_##NAME(const T *x, const T *w, T *out, int rows,     \
                                                    int n, float eps) {                           \
        rmsnorm_rows<T, 4>(x, w, out, rows, n, eps);                                              \
    }                                                                                             \
    extern "C" __global__ void rmsnorm_rows16_##NAME(const T *x, const T *w, T *out, int rows,    \
                                                     int n, float eps) {                          \
        rmsnorm_rows<T, 16>(x, w, out, rows, n, eps);                                             \
    }                                                                                             \
    extern "C" __global__ void swiglu_bwd_##NAME(const T *g, const T *u, const T *dh, T *dg,      \
                                                 T *du, size_t numel) {                           \
        swiglu_bwd<T>(g, u, dh, dg, du, numel);                                                   \
    }                                                                                             \
    extern "C" __global__ void xent_fwd_bwd_##NAME(T *z, const uint32_t *target, float *loss,     \
                                                   int v) {                                       \
        xent_fwd_bwd<T>(z, target, loss, v);                                                      \
    }

INSTANTIATE(f32, float)
INSTANTIATE(bf16, __nv_bfloat16)
INSTANTIATE(f16, __half)

// One AdamW step (Loshchilov & Hutter 2019, decoupled weight decay) over n f32
// values, written to fresh buffers: g = grad * scale; m = b1 m + (1 - b1) g;
// v = b2 v + (1 - b2) g^2; p -= lr (m / c1) / (sqrt(v / c2) + eps) + lr wd p,
// with c1 = 1 - b1^t and c2 = 1 - b2^t. The same formula as optim.rs's candle
// ops, in one pass instead of fifteen.
extern "C" __global__ void adamw_f32(const float *p, const float *grad, const float *m,
                                     const float *v, float *p_out, float *m_out, float *v_out,
                                     size_t n, float scale, float b1, float b2, float c1, float c2,
                                     float eps, float lr, float wd) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = grad[i] * scale;
        const float mi = m[i] * b1 + g * (1.f - b1);
        const float vi = v[i] * b2 + g * g * (1.f - b2);
        const float update = (mi / c1) / (sqrtf(vi / c2) + eps);
        const float pi = p[i];
        p_out[i] = pi - update * lr - pi * (lr * wd);
        m_out[i] = mi;
        v_out[i] = vi;
    }
}
