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

#include <type_traits>

// ---------------------------------------------------------------------------
// out[b, :] = embed[ids[b], :]. Grid (B), any block; 8 values a load
// where `hidden` is a multiple of 8.
template <typename T>
__device__ __forceinline__ void embed_rows(const T *__restrict__ embed, const uint32_t *__restrict__ ids,
                                           T *__restrict__ out, int hidden) {
    const T *src = embed + (size_t)ids[blockIdx.x] * hidden;
    T *dst = out + (size_t)blockIdx.x * hidden;
    if ((hidden & 7) == 0) {
        // Through f32 and back: exact for every T.
        for (int i = threadIdx.x * 8; i < hidden; i += blockDim.x * 8) {
            float v[8];
            load8(src + i, v);
            store8(dst + i, v);
        }
        return;
    }
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// x += h (rounded to T, as a separate add would), then out = rmsnorm(x) * w
// in f32, rounded once. h may be null (no add). Grid (rows), block a
// multiple of 32. Where n is a multiple of 8 and at most
// blockDim.x * 8 * RMS_CHUNKS (the host sizes the block so), each thread
// holds its chunks of 8 in registers from the loads to the output, every
// load issued before the first is used: one trip to memory, not one per
// element (the scalar loop took 9.6 us a call at 32 x 2560 on an H100).
#define RMS_CHUNKS 4
template <typename T>
__device__ __forceinline__ void add_rmsnorm(T *__restrict__ x, const T *__restrict__ h,
                                            const T *__restrict__ w, T *__restrict__ out, int n,
                                            float eps) {
    __shared__ float shared[32];
    T *xr = x + (size_t)blockIdx.x * n;
    const T *hr = h ? h + (size_t)blockIdx.x * n : nullptr;
    T *o = out + (size_t)blockIdx.x * n;
    if ((n & 7) == 0 && n <= (int)blockDim.x * 8 * RMS_CHUNKS) {
        float xv[RMS_CHUNKS][8], hv[RMS_CHUNKS][8], wv[RMS_CHUNKS][8];
#pragma unroll
        for (int c = 0; c < RMS_CHUNKS; ++c) {
            const int i = (c * blockDim.x + threadIdx.x) * 8;
            if (i < n) {
                load8(xr + i, xv[c]);
                load8(w + i, wv[c]);
                if (hr) load8(hr + i, hv[c]);
            }
        }
        float ss = 0.f;
#pragma unroll
        for (int c = 0; c < RMS_CHUNKS; ++c) {
            const int i = (c * blockDim.x + threadIdx.x) * 8;
            if (i < n) {
                if (hr) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) xv[c][e] = round_to<T>(xv[c][e] + hv[c][e]);
                    store8(xr + i, xv[c]);
                }
#pragma unroll
                for (int e = 0; e < 8; ++e) ss += xv[c][e] * xv[c][e];
            }
        }
        ss = block_sum(ss, shared);
        const float r = rsqrtf(ss / (float)n + eps);
#pragma unroll
        for (int c = 0; c < RMS_CHUNKS; ++c) {
            const int i = (c * blockDim.x + threadIdx.x) * 8;
            if (i < n) {
                float y[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) y[e] = xv[c][e] * r * wv[c][e];
                store8(o + i, y);
            }
        }
        return;
    }
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
    // Every load before the first use: the norm weight and the RoPE
    // entries do not wait for the reduction.
    float x = to_f(is_q ? q[(size_t)b * row_stride + h * d + i] : k[(size_t)b * row_stride + h * d + i]);
    const float wn = q_norm ? to_f((is_q ? q_norm : k_norm)[i]) : 0.f;
    const int half = d / 2;
    const int j = i < half ? i : i - half;
    const float c = to_f(cos[(size_t)p * half + j]), s = to_f(sin[(size_t)p * half + j]);
    if (q_norm) {
        const float ss = block_sum(x * x, shared);
        // Rounded as the separate norm's output is.
        x = to_f(from_f<T>(x * rsqrtf(ss / (float)d + eps) * wn));
    }
    vals[i] = x;
    __syncthreads();
    const float y = i < half ? x * c - vals[i + half] * s : x * c + vals[i - half] * s;
    if (is_q) {
        q_out[((size_t)b * hq + h) * d + i] = from_f<T>(y);
    } else {
        k_cache[(((size_t)b * hkv + h) * cap + p) * d + i] = from_f<T>(y);
    }
}

// out[b, i] = silu(gate[b, i]) * up[b, i] in f32, rounded once. Where n
// and row_stride are multiples of 8, a thread takes 8 values (grid
// (ceil(n / 8 / 256), B)); else one (grid (ceil(n / 256), B)). Block 256.
template <typename T>
__device__ __forceinline__ void silu_mul(const T *__restrict__ gate, const T *__restrict__ up,
                                         int row_stride, T *__restrict__ out, int n) {
    const int b = blockIdx.y;
    if ((n & 7) == 0 && (row_stride & 7) == 0) {
        const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
        if (i >= n) return;
        float g[8], u[8], y[8];
        load8(gate + (size_t)b * row_stride + i, g);
        load8(up + (size_t)b * row_stride + i, u);
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
        store8(out + (size_t)b * n + i, y);
        return;
    }
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = to_f(gate[(size_t)b * row_stride + i]);
    const float u = to_f(up[(size_t)b * row_stride + i]);
    out[(size_t)b * n + i] = from_f<T>(g / (1.f + __expf(-g)) * u);
}

// NV (1, 2 or 4) consecutive values as f32, in one load.
template <int NV, typename T> __device__ __forceinline__ void loadv(const T *p, float *v) {
    if constexpr (sizeof(T) == 2 && NV > 1) {
        using Raw = typename std::conditional<NV == 4, uint2, uint32_t>::type;
        const Raw a = *reinterpret_cast<const Raw *>(p);
        const T *h = reinterpret_cast<const T *>(&a);
#pragma unroll
        for (int e = 0; e < NV; ++e) v[e] = to_f(h[e]);
    } else if constexpr (sizeof(T) == 4 && NV == 4) {
        const float4 a = *reinterpret_cast<const float4 *>(p);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
#pragma unroll
        for (int e = 0; e < NV; ++e) v[e] = to_f(p[e]);
    }
}

// The partial result of one split from its W warps' online softmaxes (max
// m, sum l and unnormalised output acc of each query head, in shared
// memory): out[g] = [M, sum_w e^(m_w - M) l_w, sum_w e^(m_w - M) acc_w[D]]
// with M the largest m_w. The block's 32 W threads share the G x D outputs.
template <int G, int D, int W>
__device__ __forceinline__ void merge_warps(const float (*s_m)[G], const float (*s_l)[G],
                                            const float (*s_acc)[G][D], float *__restrict__ out) {
    for (int i = threadIdx.x; i < G * D; i += 32 * W) {
        const int g = i / D, d = i % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w) mx = fmaxf(mx, s_m[w][g]);
        // A warp that saw no key has m = -inf and adds nothing.
        float a = 0.f, sum = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            if (s_m[w][g] != -INFINITY) {
                const float f = __expf(s_m[w][g] - mx);
                a += s_acc[w][g][d] * f;
                sum += s_l[w][g] * f;
            }
        }
        out[g * (D + 2) + 2 + d] = a;
        if (d == 0) out[g * (D + 2)] = mx, out[g * (D + 2) + 1] = sum;
    }
}

// The keys [start, end) of split `split` of a row of `len` keys: each
// row's chunk c is `chunk` (a multiple of 64), or more where the row is
// longer than the splits x chunk (a multiple of 64 that spreads it over
// every split). The grid's splits are fixed at capture whatever the slots'
// length, so a short row leaves most splits idle (start >= end) and a long
// one lengthens its chunks instead of needing more blocks.
__device__ __forceinline__ void split_keys(int len, int chunk, int split, int splits, int &start, int &end) {
    const int per = (len + splits - 1) / splits;
    const int c = max(chunk, (per + 63) / 64 * 64);
    start = split * c;
    end = min(start + c, len);
}

// The keys of the block (kv head blockIdx.x, row blockIdx.y, split
// blockIdx.z) of a split decode attention, [start, end), and its slot of
// `part` (G query heads of D + 2 values). False where the split has no
// keys: its slot is marked empty then (l = 0, which the combine skips).
template <int D, int G>
__device__ __forceinline__ bool split_slot(const uint32_t *__restrict__ pos, float *__restrict__ part, int hkv,
                                           int chunk, int &start, int &end, float *&out) {
    const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    split_keys((int)pos[b] + 1, chunk, split, splits, start, end);
    out = part + (((size_t)b * hkv + h) * splits + split) * G * (D + 2);
    if (start >= end) {
        if (threadIdx.x < G) out[threadIdx.x * (D + 2) + 1] = 0.f;
        return false;
    }
    return true;
}

// Flash-decoding (split-KV) attention of one token a row over its slot,
// one key a lane: block (kv head h, row b, split s) reads the row's keys
// and values of columns [s * c, min((s + 1) * c, pos[b] + 1)) once for the
// G query heads h * G .. h * G + G - 1 that share them, and writes per query
// head its max m, sum l and unnormalised output acc (f32) to
// `part[(b, h, s, g)] = [m, l, acc[D]]`; attention_combine merges the
// splits. The block's W warps take 32
// keys at a time (tiles w, w + W, ... of the split's range): lane j scores
// key j against the G query heads whole (queries scaled, in shared
// memory), so the scores need no reduction across lanes; the warp then
// updates each head's online softmax once per 32 keys, and for the values
// lane j holds D / 32 output columns of every head and adds each of the
// 32 keys' rows in turn (one coalesced row a load), its weight passed by a
// shuffle. Lanes past the range read a real key and weigh it 0. The warps
// merge in shared memory. Grid (H_kv, B, splits), block 32 W.
//
// Measured on an H100 at Qwen3-4B's shapes (batch 32, 8 KV heads, G = 4,
// D = 128, bf16; benches/decode_attention.cu), with the combine: 34.8 us
// against decode_attention's 44.3 at 384 keys a row, 29.7 against 35.8 at
// 266, with W = 4 and 128-key chunks. decode_attention (16 lanes a key,
// now in the bench as its reference) spent 16 shuffles a key on the scores
// and was held at 16 warps a multiprocessor by its registers; this kernel
// takes 72 registers. Copying
// each warp's tile to shared memory with cp.async first was no faster: the
// buffers held a multiprocessor to 6 warps. A plain coalesced read of the
// same bytes runs at 2.5 TB/s (20 us at 384), so there is room left.
template <typename T, int D, int G, int W>
__device__ __forceinline__ void decode_attention_keys(const T *__restrict__ q, const T *__restrict__ k_cache,
                                                      const T *__restrict__ v_cache,
                                                      const uint32_t *__restrict__ pos,
                                                      float *__restrict__ part, int hkv, int cap, int chunk,
                                                      float scale) {
    constexpr int NV = D / 32;
    __shared__ __align__(16) float qs[G][D];
    __shared__ float s_m[W][G], s_l[W][G];
    __shared__ float s_acc[W][G][D];
    const int h = blockIdx.x, b = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int start, end;
    float *out;
    if (!split_slot<D, G>(pos, part, hkv, chunk, start, end, out)) return;
    const int hq = hkv * G;
    for (int i = tid; i < G * D; i += 32 * W)
        qs[i / D][i % D] = to_f(q[((size_t)b * hq + h * G) * D + i]) * scale;
    __syncthreads();
    float m[G], l[G], acc[G][NV];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < NV; ++e) acc[g][e] = 0.f;
    }
    const T *kb = k_cache + ((size_t)b * hkv + h) * cap * D;
    const T *vb = v_cache + ((size_t)b * hkv + h) * cap * D + lane * NV;
    for (int t0 = start + warp * 32; t0 < end; t0 += 32 * W) {
        const int nk = min(32, end - t0);
        const bool valid = lane < nk;
        const T *kr = kb + (size_t)(t0 + (valid ? lane : 0)) * D;
        float s[G];
#pragma unroll
        for (int g = 0; g < G; ++g) s[g] = 0.f;
#pragma unroll
        for (int d0 = 0; d0 < D; d0 += 32) {
            float kv[32];
#pragma unroll
            for (int i = 0; i < 4; ++i) load8(kr + d0 + 8 * i, kv + 8 * i);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float4 *qv = reinterpret_cast<const float4 *>(&qs[g][d0]);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const float4 a = qv[i];
                    s[g] += a.x * kv[4 * i] + a.y * kv[4 * i + 1] + a.z * kv[4 * i + 2] + a.w * kv[4 * i + 3];
                }
            }
        }
        float p[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float x = valid ? s[g] : -INFINITY;
            const float mn = fmaxf(m[g], warp_max(x));
            const float corr = __expf(m[g] - mn);
            p[g] = valid ? __expf(x - mn) : 0.f;
            l[g] = l[g] * corr + warp_sum(p[g]);
#pragma unroll
            for (int e = 0; e < NV; ++e) acc[g][e] *= corr;
            m[g] = mn;
        }
#pragma unroll 8
        for (int j = 0; j < 32; ++j) {
            float vv[NV];
            loadv<NV>(vb + (size_t)(t0 + min(j, nk - 1)) * D, vv);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float pj = __shfl_sync(0xffffffffu, p[g], j);
#pragma unroll
                for (int e = 0; e < NV; ++e) acc[g][e] += pj * vv[e];
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) s_m[warp][g] = m[g], s_l[warp][g] = l[g];
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int e = 0; e < NV; ++e) s_acc[warp][g][lane * NV + e] = acc[g][e];
    }
    __syncthreads();
    merge_warps<G, D, W>(s_m, s_l, s_acc, out);
}

// Bytes of a decode_attention_mma block's dynamic shared memory: each of
// its W warps holds a tile of 32 keys and their values, rows padded to
// 2 D + 16 bytes.
__host__ __device__ constexpr int decode_attention_mma_smem(int d, int w) { return w * 2 * 32 * (2 * d + 16); }

// decode_attention_keys on tensor cores, for bf16 (the same grid, splits
// and partial results; attention_combine merges the splits). Each warp
// takes tiles of 32 keys of its block's split (tiles w, w + W, ...),
// copies the tile's keys and values to its own shared memory (cp.async;
// rows past the split are zeroed, so that a weight of 0 never meets a
// stale NaN), and computes S = Q K^T and O += P V with mma.sync m16n8k16:
// the G query heads are rows 0..G-1 of the 16-row A operand (the rest
// zero, so G <= 8), the keys are the B operand straight from their rows,
// the values come through ldmatrix.trans, and P stays in registers
// between the two products (the S accumulators are P's A fragments).
// Scores are scaled in f32; P is rounded to bf16 for the second product
// and the softmax's sum l adds the rounded values, so each head's weights
// sum to one as used. Rows are padded to 2 D + 16 bytes, so the key
// fragments' loads and ldmatrix's rows are free of bank conflicts. Grid
// (H_kv, B, splits), block 32 W, decode_attention_mma_smem(D, W) bytes of
// dynamic shared memory.
//
// Measured on an H200 at Qwen3-4B's shapes (batch 32, 8 KV heads, G = 4,
// D = 128; benches/decode_attention.cu, kind 20 against kind 4, with the
// combine): 22.5 us (128-key chunks) / 20.1 us (256) against 28.7 at 266
// keys a row, 32.6 / 30.5 against 45.9 / 39.4 at 511. Max abs error
// against an f32 reference 4e-3..8e-3 (P in bf16; measured while l still
// added P unrounded), decode_attention_keys' 1e-3.
template <int D, int G, int W>
__device__ __forceinline__ void decode_attention_mma(const __nv_bfloat16 *__restrict__ q,
                                                     const __nv_bfloat16 *__restrict__ k_cache,
                                                     const __nv_bfloat16 *__restrict__ v_cache,
                                                     const uint32_t *__restrict__ pos, float *__restrict__ part,
                                                     int hkv, int cap, int chunk, float scale) {
    static_assert(D % 16 == 0 && G >= 1 && G <= 8, "head dim a multiple of 16, at most 8 query heads a KV head");
    constexpr int TK = 32, ROWB = 2 * D + 16, PIECES = D / 8; // keys a tile, bytes a row, 16-byte pieces a row
    extern __shared__ __align__(16) unsigned char attn_smem[];
    __shared__ float s_m[W][G], s_l[W][G];
    const int h = blockIdx.x, b = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    unsigned char *ks = attn_smem + warp * (2 * TK * ROWB), *vs = ks + TK * ROWB;
    int start, end;
    float *out;
    if (!split_slot<D, G>(pos, part, hkv, chunk, start, end, out)) return;
    // Q's A fragments: qa[kk][0] = Q[g][16 kk + 2t, +1], qa[kk][1] = Q[g][16 kk + 8 + 2t, +1].
    uint32_t qa[D / 16][2];
    const __nv_bfloat16 *qb = q + ((size_t)b * hkv * G + (size_t)h * G) * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        qa[kk][0] = g < G ? *reinterpret_cast<const uint32_t *>(qb + g * D + kk * 16 + 2 * t) : 0u;
        qa[kk][1] = g < G ? *reinterpret_cast<const uint32_t *>(qb + g * D + kk * 16 + 8 + 2 * t) : 0u;
    }
    const __nv_bfloat16 *kb = k_cache + ((size_t)b * hkv + h) * cap * D;
    const __nv_bfloat16 *vb = v_cache + ((size_t)b * hkv + h) * cap * D;
    float m_i = -INFINITY, l_i = 0.f;
    // acc[j][e], e < 2: head g's output at dimension 8 j + 2t + e (e >= 2: rows 8.., zero).
    float acc[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int t0 = start + warp * TK; t0 < end; t0 += W * TK) {
        const int n = min(TK, end - t0);
        for (int i = lane; i < TK * PIECES; i += 32) {
            const int row = i / PIECES, piece = i % PIECES;
            unsigned char *kd = ks + row * ROWB + piece * 16, *vd = vs + row * ROWB + piece * 16;
            if (row < n) {
                cp_async16(kd, kb + (size_t)(t0 + row) * D + piece * 8);
                cp_async16(vd, vb + (size_t)(t0 + row) * D + piece * 8);
            } else {
                *reinterpret_cast<uint4 *>(kd) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4 *>(vd) = make_uint4(0, 0, 0, 0);
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncwarp();
        // s[nt][e], e < 2: head g's score of key 8 nt + 2t + e.
        float s[TK / 8][4];
#pragma unroll
        for (int j = 0; j < TK / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int nt = 0; nt < TK / 8; ++nt) {
                const unsigned char *kr = ks + (nt * 8 + g) * ROWB + kk * 32 + t * 4;
                mma_bf16(s[nt], qa[kk][0], 0u, qa[kk][1], 0u, *reinterpret_cast<const uint32_t *>(kr),
                         *reinterpret_cast<const uint32_t *>(kr + 16));
            }
        }
        // The online softmax of head g over the tile: the quad of lanes 4g..4g+3 holds its 32 scores.
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < TK / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float x = nt * 8 + 2 * t + e < n ? s[nt][e] * scale : -INFINITY;
                s[nt][e] = x;
                mx = fmaxf(mx, x);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m_i, mx); // finite: the tile has a key
        const float corr = __expf(m_i - mn);
        // P as bf16 pairs, pa[nt] = keys 8 nt + 2t, +1 (P's A fragments).
        uint32_t pa[TK / 8];
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < TK / 8; ++nt) {
            const __nv_bfloat162 p = __floats2bfloat162_rn(__expf(s[nt][0] - mn), __expf(s[nt][1] - mn));
            const float2 pf = __bfloat1622float2(p);
            sum += pf.x + pf.y;
            pa[nt] = *reinterpret_cast<const uint32_t *>(&p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l_i = l_i * corr + sum;
        m_i = mn;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) acc[j][0] *= corr, acc[j][1] *= corr;
#pragma unroll
        for (int kstep = 0; kstep < TK / 16; ++kstep) {
            // Matrix i = lane / 8 of ldmatrix: keys 16 kstep + 8 (i & 1) .., dimensions 16 np + 8 (i >> 1) ..
            const int i = lane >> 3;
            const unsigned char *vrow = vs + (kstep * 16 + (lane & 7) + (i & 1) * 8) * ROWB + (i >> 1) * 16;
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
                uint32_t r0, r1, r2, r3;
                ldmatrix_x4_trans(r0, r1, r2, r3, vrow + np * 32);
                mma_bf16(acc[2 * np], pa[2 * kstep], 0u, pa[2 * kstep + 1], 0u, r0, r1);
                mma_bf16(acc[2 * np + 1], pa[2 * kstep], 0u, pa[2 * kstep + 1], 0u, r2, r3);
            }
        }
        __syncwarp(); // the tile's buffers are free
    }
    // Merge the warps through the (now free) tile buffers.
    __syncthreads();
    float(*s_o)[G][D] = reinterpret_cast<float(*)[G][D]>(attn_smem);
    if (g < G) {
        if (t == 0) s_m[warp][g] = m_i, s_l[warp][g] = l_i;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            s_o[warp][g][j * 8 + 2 * t] = acc[j][0];
            s_o[warp][g][j * 8 + 2 * t + 1] = acc[j][1];
        }
    }
    __syncthreads();
    merge_warps<G, D, W>(s_m, s_l, s_o, out);
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

#define ATTN_WARPS 4
#define ATTENTION_KERNEL(S, T, D, G)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * ATTN_WARPS)                                    \
        decode_attention_##S##_d##D##_g##G(const T *q, const T *k_cache, const T *v_cache,          \
                                          const uint32_t *pos, float *part, int hkv, int cap,        \
                                          int chunk, float scale) {                                  \
        decode_attention_keys<T, D, G, ATTN_WARPS>(q, k_cache, v_cache, pos, part, hkv, cap, chunk,  \
                                                   scale);                                           \
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

// decode_attention_mma for bf16 at the same head sizes and groups
// (fast_decode.rs takes decode_attention_* for other dtypes).
#define ATTENTION_MMA_KERNEL(D, G)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * ATTN_WARPS)                                    \
        decode_attention_mma_bf16_d##D##_g##G(const __nv_bfloat16 *q, const __nv_bfloat16 *k_cache, \
                                              const __nv_bfloat16 *v_cache, const uint32_t *pos,     \
                                              float *part, int hkv, int cap, int chunk,              \
                                              float scale) {                                         \
        decode_attention_mma<D, G, ATTN_WARPS>(q, k_cache, v_cache, pos, part, hkv, cap, chunk,     \
                                               scale);                                               \
    }

#define ATTENTION_MMA_GROUPS(D)                                                                      \
    ATTENTION_MMA_KERNEL(D, 1)                                                                       \
    ATTENTION_MMA_KERNEL(D, 2)                                                                       \
    ATTENTION_MMA_KERNEL(D, 3)                                                                       \
    ATTENTION_MMA_KERNEL(D, 4)                                                                       \
    ATTENTION_MMA_KERNEL(D, 5)                                                                       \
    ATTENTION_MMA_KERNEL(D, 6)                                                                       \
    ATTENTION_MMA_KERNEL(D, 7)                                                                       \
    ATTENTION_MMA_KERNEL(D, 8)

ATTENTION_MMA_GROUPS(32)
ATTENTION_MMA_GROUPS(64)
ATTENTION_MMA_GROUPS(128)
