// The decode step's own kernels (src/model/fast_decode.rs): one token a row,
// every row in its own slot of the KV cache, so that a step's shapes and
// buffers never change and the whole step can be captured as a CUDA graph.
// Everything that varies from step to step (the rows' tokens, positions
// and random seeds) is read from device memory written before the step.
//
// Layouts: the KV cache of a layer is (B, H_kv, cap, D), row b's column t
// holding its token t; queries (B, H_q, D); the projections' outputs are
// rows of B with a stride (a fused projection's output is read in place).

#include "common.cuh"

// ---------------------------------------------------------------------------
// out[b, :] = embed[ids[b], :]. Grid (B), any block.
template <typename T>
__device__ __forceinline__ void embed_rows(const T *__restrict__ embed, const uint32_t *__restrict__ ids,
                                           T *__restrict__ out, int hidden) {
    const T *src = embed + (size_t)ids[blockIdx.x] * hidden;
    T *dst = out + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// x += h (rounded to T, as a separate add would), then out = rmsnorm(x) * w
// in f32, rounded once. h may be null (no add). Grid (rows), block 256.
template <typename T>
__device__ __forceinline__ void add_rmsnorm(T *__restrict__ x, const T *__restrict__ h,
                                            const T *__restrict__ w, T *__restrict__ out, int n,
                                            float eps) {
    __shared__ float shared[32];
    T *xr = x + (size_t)blockIdx.x * n;
    const T *hr = h ? h + (size_t)blockIdx.x * n : nullptr;
    T *o = out + (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = to_f(xr[i]);
        if (hr) {
            const T sum = from_f<T>(v + to_f(hr[i]));
            xr[i] = sum;
            v = to_f(sum);
        }
        ss += v * v;
    }
    ss = block_sum(ss, shared);
    const float r = rsqrtf(ss / (float)n + eps);
    // Each thread reads back only the elements it wrote.
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = from_f<T>(to_f(xr[i]) * r * to_f(w[i]));
}

// The attention prologue of one token a row: per-head RMSNorm of queries
// and keys (when q_norm is not null), rotary embedding at the row's
// position (HF layout: halves, not interleaved), keys and values written
// into the row's slot of the cache at column pos[b], rotated queries into
// q_out. Grid (H_q + 2 H_kv, B), block D (a multiple of 32, at most 256).
template <typename T>
__device__ __forceinline__ void qkv_prep(const T *__restrict__ q, const T *__restrict__ k,
                                         const T *__restrict__ v, int row_stride,
                                         const T *__restrict__ q_norm, const T *__restrict__ k_norm,
                                         const T *__restrict__ cos, const T *__restrict__ sin,
                                         const uint32_t *__restrict__ pos, T *__restrict__ q_out,
                                         T *__restrict__ k_cache, T *__restrict__ v_cache, int hq,
                                         int hkv, int cap, float eps) {
    __shared__ float shared[32];
    __shared__ float vals[256];
    const int head = blockIdx.x, b = blockIdx.y, i = threadIdx.x, d = blockDim.x;
    const uint32_t p = pos[b];
    if (head >= hq + hkv) {
        const int h = head - hq - hkv;
        v_cache[(((size_t)b * hkv + h) * cap + p) * d + i] = v[(size_t)b * row_stride + h * d + i];
        return;
    }
    const bool is_q = head < hq;
    const int h = is_q ? head : head - hq;
    float x = to_f(is_q ? q[(size_t)b * row_stride + h * d + i] : k[(size_t)b * row_stride + h * d + i]);
    if (q_norm) {
        const float ss = block_sum(x * x, shared);
        const T *w = is_q ? q_norm : k_norm;
        // Rounded as the separate norm's output is.
        x = to_f(from_f<T>(x * rsqrtf(ss / (float)d + eps) * to_f(w[i])));
    }
    vals[i] = x;
    __syncthreads();
    const int half = d / 2;
    const int j = i < half ? i : i - half;
    const float c = to_f(cos[(size_t)p * half + j]), s = to_f(sin[(size_t)p * half + j]);
    const float y = i < half ? x * c - vals[i + half] * s : x * c + vals[i - half] * s;
    if (is_q) {
        q_out[((size_t)b * hq + h) * d + i] = from_f<T>(y);
    } else {
        k_cache[(((size_t)b * hkv + h) * cap + p) * d + i] = from_f<T>(y);
    }
}

// out[b, i] = silu(gate[b, i]) * up[b, i] in f32, rounded once.
// Grid (ceil(n / 256), B), block 256.
template <typename T>
__device__ __forceinline__ void silu_mul(const T *__restrict__ gate, const T *__restrict__ up,
                                         int row_stride, T *__restrict__ out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (i >= n) return;
    const float g = to_f(gate[(size_t)b * row_stride + i]);
    const float u = to_f(up[(size_t)b * row_stride + i]);
    out[(size_t)b * n + i] = from_f<T>(g / (1.f + __expf(-g)) * u);
}

// 8 consecutive values as f32 (16-byte aligned for 16-bit types, 32 for f32).
__device__ __forceinline__ void load8(const float *p, float *v) {
    const float4 *q = reinterpret_cast<const float4 *>(p);
    const float4 a = q[0], b = q[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float *v) {
    const uint4 a = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ void load8(const __half *p, float *v) {
    const uint4 a = *reinterpret_cast<const uint4 *>(p);
    const __half2 *h = reinterpret_cast<const __half2 *>(&a);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h[i]);
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
}

// Flash-decoding (split-KV) attention of one token a row over its slot:
// block (kv head h, row b, split s) reads the row's keys and values of
// columns [s * c, min((s + 1) * c, pos[b] + 1)) once for the G
// query heads h * G .. h * G + G - 1 that share them, and writes per query
// head its max m, sum l and unnormalised output acc (f32) to
// `part[(b, h, s, g)] = [m, l, acc[D]]`; attention_combine merges the
// splits. D / 8 lanes hold one key (8 values a lane, one 16-byte load for
// 16-bit types), 128 / (D / 8) keys are in flight a block, the next key's
// loads issued before the current one is used; each group keeps an online
// softmax that the block merges at the end. Grid (H_kv, B, splits), block
// 128.
#define ATTN_THREADS 128
template <typename T, int D, int G>
__device__ __forceinline__ void decode_attention(const T *__restrict__ q, const T *__restrict__ k_cache,
                                                 const T *__restrict__ v_cache,
                                                 const uint32_t *__restrict__ pos,
                                                 float *__restrict__ part, int hkv, int cap, int chunk,
                                                 float scale) {
    constexpr int E = 8;
    constexpr int LANES = D / E;
    constexpr int GROUPS = ATTN_THREADS / LANES;
    __shared__ float s_m[GROUPS][G];
    __shared__ float s_l[GROUPS][G];
    __shared__ float s_red[GROUPS][D];
    __shared__ float s_max[G];
    const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int tid = threadIdx.x, grp = tid / LANES, lane = tid % LANES;
    const int len = (int)pos[b] + 1;
    // Each row's chunk c: `chunk` (a multiple of 64), or more where the row
    // is longer than the splits x chunk (a multiple of 64 that spreads it
    // over every split). The grid's splits are fixed at capture whatever
    // the slots' length, so a short row leaves most splits idle and a long
    // one lengthens its chunks instead of needing more blocks.
    const int per = (len + splits - 1) / splits;
    const int c = max(chunk, (per + 63) / 64 * 64);
    const int start = split * c, end = min(start + c, len);
    float *out = part + (((size_t)b * hkv + h) * splits + split) * G * (D + 2);
    if (start >= end) {
        if (tid < G) out[tid * (D + 2) + 1] = 0.f; // l = 0: the combine skips it
        return;
    }
    const int hq = hkv * G;
    float qr[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        load8(q + ((size_t)b * hq + h * G + g) * D + lane * E, qr[g]);
#pragma unroll
        for (int e = 0; e < E; ++e) qr[g][e] *= scale;
    }
    float m[G], l[G], acc[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = 0.f;
    }
    const T *kb = k_cache + ((size_t)b * hkv + h) * cap * D + lane * E;
    const T *vb = v_cache + ((size_t)b * hkv + h) * cap * D + lane * E;
    float kr[E], vr[E];
    int t = start + grp;
    if (t < end) {
        load8(kb + (size_t)t * D, kr);
        load8(vb + (size_t)t * D, vr);
    }
    // The same trip count for every thread: shuffles need the whole warp.
    for (int t0 = start; t0 < end; t0 += GROUPS) {
        const bool valid = t < end;
        const int tn = t + GROUPS;
        float kn[E], vn[E];
        if (tn < end) {
            load8(kb + (size_t)tn * D, kn);
            load8(vb + (size_t)tn * D, vn);
        }
        float s[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float x = 0.f;
#pragma unroll
            for (int e = 0; e < E; ++e) x += qr[g][e] * (valid ? kr[e] : 0.f);
#pragma unroll
            for (int o = LANES / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
            s[g] = x;
        }
        if (valid) {
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float mn = fmaxf(m[g], s[g]);
                const float corr = __expf(m[g] - mn), p = __expf(s[g] - mn);
                l[g] = l[g] * corr + p;
#pragma unroll
                for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * corr + p * vr[e];
                m[g] = mn;
            }
        }
        t = tn;
#pragma unroll
        for (int e = 0; e < E; ++e) kr[e] = kn[e], vr[e] = vn[e];
    }
    // Merge the groups: the block's max, then each group's share rescaled
    // to it and summed over groups through shared memory, a head at a time.
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) s_m[grp][g] = m[g], s_l[grp][g] = l[g];
    }
    __syncthreads();
    if (tid < G) {
        float mx = -INFINITY;
        for (int j = 0; j < GROUPS; ++j) mx = fmaxf(mx, s_m[j][tid]);
        s_max[tid] = mx;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; ++g) {
        // A group that saw no key has m = -inf and contributes nothing.
        const float w = m[g] == -INFINITY ? 0.f : __expf(m[g] - s_max[g]);
#pragma unroll
        for (int e = 0; e < E; ++e) s_red[grp][lane * E + e] = acc[g][e] * w;
        __syncthreads();
        float *o = out + g * (D + 2);
        for (int i = tid; i < D; i += ATTN_THREADS) {
            float a = 0.f;
            for (int j = 0; j < GROUPS; ++j) a += s_red[j][i];
            o[2 + i] = a;
        }
        if (tid == 0) {
            float sum = 0.f;
            for (int j = 0; j < GROUPS; ++j) {
                if (s_m[j][g] != -INFINITY) sum += s_l[j][g] * __expf(s_m[j][g] - s_max[g]);
            }
            o[0] = s_max[g];
            o[1] = sum;
        }
        __syncthreads();
    }
}

// Merges decode_attention's splits: out[b, hq * D + i] = sum_s e^(m_s - M)
// acc_s[i] / sum_s e^(m_s - M) l_s. Grid (H_q, B), block D.
template <typename T>
__device__ __forceinline__ void attention_combine(const float *__restrict__ part, T *__restrict__ out,
                                                  int hkv, int group, int splits) {
    const int head = blockIdx.x, b = blockIdx.y, i = threadIdx.x, d = blockDim.x;
    const int h = head / group, g = head % group;
    const float *p0 = part + ((size_t)b * hkv + h) * splits * group * (d + 2);
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) {
        const float *ps = p0 + ((size_t)s * group + g) * (d + 2);
        if (ps[1] > 0.f) mx = fmaxf(mx, ps[0]);
    }
    float den = 0.f, num = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float *ps = p0 + ((size_t)s * group + g) * (d + 2);
        if (ps[1] > 0.f) {
            const float w = __expf(ps[0] - mx);
            den += w * ps[1];
            num += w * ps[2 + i];
        }
    }
    out[((size_t)b * hkv * group + head) * d + i] = from_f<T>(num / den);
}

// Copies prefilled keys or values into the rows' slots: source row r of
// `src: (R, H_kv, src_cap, D)` holds its prompt in columns [pads[r],
// pads[r] + lens[r]); they go to columns [0, lens[r]) of slot rows[r] of
// `dst: (B, H_kv, cap, D)`. Grid (H_kv, R), any block.
template <typename T>
__device__ __forceinline__ void copy_to_slots(const T *__restrict__ src, T *__restrict__ dst,
                                              const uint32_t *__restrict__ rows,
                                              const uint32_t *__restrict__ pads,
                                              const uint32_t *__restrict__ lens, int hkv, int src_cap,
                                              int cap, int d) {
    const int h = blockIdx.x, r = blockIdx.y;
    const T *s = src + (((size_t)r * hkv + h) * src_cap + pads[r]) * d;
    T *t = dst + ((size_t)rows[r] * hkv + h) * cap * d;
    const size_t n = (size_t)lens[r] * d;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) t[i] = s[i];
}

#define DECODE_KERNELS(S, T)                                                                        \
    extern "C" __global__ void embed_rows_##S(const T *embed, const uint32_t *ids, T *out,          \
                                              int hidden) {                                          \
        embed_rows<T>(embed, ids, out, hidden);                                                      \
    }                                                                                                \
    extern "C" __global__ void add_rmsnorm_##S(T *x, const T *h, const T *w, T *out, int n,         \
                                               float eps) {                                          \
        add_rmsnorm<T>(x, h, w, out, n, eps);                                                        \
    }                                                                                                \
    extern "C" __global__ void qkv_prep_##S(const T *q, const T *k, const T *v, int row_stride,     \
                                            const T *q_norm, const T *k_norm, const T *cos,          \
                                            const T *sin, const uint32_t *pos, T *q_out,             \
                                            T *k_cache, T *v_cache, int hq, int hkv, int cap,         \
                                            float eps) {                                             \
        qkv_prep<T>(q, k, v, row_stride, q_norm, k_norm, cos, sin, pos, q_out, k_cache, v_cache,    \
                    hq, hkv, cap, eps);                                                              \
    }                                                                                                \
    extern "C" __global__ void silu_mul_##S(const T *gate, const T *up, int row_stride, T *out,     \
                                            int n) {                                                 \
        silu_mul<T>(gate, up, row_stride, out, n);                                                   \
    }                                                                                                \
    extern "C" __global__ void attention_combine_##S(const float *part, T *out, int hkv, int group, \
                                                     int splits) {                                   \
        attention_combine<T>(part, out, hkv, group, splits);                                         \
    }                                                                                                \
    extern "C" __global__ void copy_to_slots_##S(const T *src, T *dst, const uint32_t *rows,         \
                                                 const uint32_t *pads, const uint32_t *lens,         \
                                                 int hkv, int src_cap, int cap, int d) {             \
        copy_to_slots<T>(src, dst, rows, pads, lens, hkv, src_cap, cap, d);                          \
    }

DECODE_KERNELS(f32, float)
DECODE_KERNELS(bf16, __nv_bfloat16)
DECODE_KERNELS(f16, __half)

#define ATTENTION_KERNEL(S, T, D, G)                                                                \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS)                                       \
        decode_attention_##S##_d##D##_g##G(const T *q, const T *k_cache, const T *v_cache,          \
                                          const uint32_t *pos, float *part, int hkv, int cap,        \
                                          int chunk, float scale) {                                  \
        decode_attention<T, D, G>(q, k_cache, v_cache, pos, part, hkv, cap, chunk, scale);           \
    }

#define ATTENTION_GROUPS(S, T, D)                                                                    \
    ATTENTION_KERNEL(S, T, D, 1)                                                                     \
    ATTENTION_KERNEL(S, T, D, 2)                                                                     \
    ATTENTION_KERNEL(S, T, D, 3)                                                                     \
    ATTENTION_KERNEL(S, T, D, 4)                                                                     \
    ATTENTION_KERNEL(S, T, D, 5)                                                                     \
    ATTENTION_KERNEL(S, T, D, 6)                                                                     \
    ATTENTION_KERNEL(S, T, D, 7)                                                                     \
    ATTENTION_KERNEL(S, T, D, 8)

#define ATTENTION_SIZES(S, T)                                                                        \
    ATTENTION_GROUPS(S, T, 32)                                                                       \
    ATTENTION_GROUPS(S, T, 64)                                                                       \
    ATTENTION_GROUPS(S, T, 128)

ATTENTION_SIZES(f32, float)
ATTENTION_SIZES(bf16, __nv_bfloat16)
ATTENTION_SIZES(f16, __half)
