// The decode step's attention kernels (src/kernels/decode.cu:
// decode_attention_keys, one key a lane, W warps a block, kind 4; and
// decode_attention_mma on tensor cores, kind 20) at Qwen3-4B's decode shapes, timed and checked on one GPU against the kernel it
// replaced (decode_attention below: 16 lanes a key) and against a plain
// coalesced read of the same bytes (`probe`), each attention followed by
// attention_combine, over a KV
// cache of batch 32, 8 KV heads, 512 columns, head dim 128, bf16. Eight
// layers' caches are cycled so that L2 (50 MB on an H100) holds none.
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -c benches/decode_attention.cu -o da.o
//   g++ da.o -o da -L$CUDA_HOME/lib64 -lcudart && ./da
#include "../src/kernels/decode.cu"
#include "mma.cuh"

#include <cstdio>
#include <cstdlib>
#include <vector>

// The previous kernel, kept here as the reference the new one is measured
// and checked against.
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

typedef __nv_bfloat16 bf;
constexpr int B = 32, HKV = 8, G = 4, D = 128, CAP = 512, LAYERS = 8;

__global__ void old_attn(const bf *q, const bf *k, const bf *v, const uint32_t *pos, float *part, int hkv,
                         int cap, int chunk, float scale) {
    decode_attention<bf, D, G>(q, k, v, pos, part, hkv, cap, chunk, scale);
}
template <int W>
__global__ void __launch_bounds__(32 * W) new_attn(const bf *q, const bf *k, const bf *v, const uint32_t *pos,
                                                   float *part, int hkv, int cap, int chunk, float scale) {
    decode_attention_keys<bf, D, G, W>(q, k, v, pos, part, hkv, cap, chunk, scale);
}
// The combine folded into a split block: every split block, empty ones
// included, counts itself in `counters[b, h]` once its partial result is
// written (the fence makes the writes visible device-wide first), and the
// last one merges the splits for its G query heads, in split order as
// attention_combine does, and leaves the counter at zero for the next
// launch.
__device__ __forceinline__ void merge_if_last(const float *part, bf *out, uint32_t *counters, int hkv) {
    __threadfence();
    __syncthreads();
    __shared__ bool last;
    const int h = blockIdx.x, b = blockIdx.y, splits = gridDim.z, tid = threadIdx.x;
    if (tid == 0) last = atomicAdd(&counters[b * hkv + h], 1u) == (unsigned)(splits - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float *p0 = part + ((size_t)b * hkv + h) * splits * G * (D + 2);
    for (int j = tid; j < G * D; j += blockDim.x) {
        const int g = j / D, i = j % D;
        float mx = -INFINITY;
        for (int sp = 0; sp < splits; ++sp) {
            const float *ps = p0 + ((size_t)sp * G + g) * (D + 2);
            if (__ldcg(ps + 1) > 0.f) mx = fmaxf(mx, __ldcg(ps));
        }
        float den = 0.f, num = 0.f;
        for (int sp = 0; sp < splits; ++sp) {
            const float *ps = p0 + ((size_t)sp * G + g) * (D + 2);
            const float l = __ldcg(ps + 1);
            if (l > 0.f) {
                const float w = __expf(__ldcg(ps) - mx);
                den += w * l;
                num += w * __ldcg(ps + 2 + i);
            }
        }
        out[((size_t)b * hkv * G + h * G + g) * D + i] = __float2bfloat16(num / den);
    }
    if (tid == 0) counters[b * hkv + h] = 0;
}
// new_attn<W> with attention_combine folded in (merge_if_last): one launch
// a layer instead of two. Measured in session 20: slower than the two
// launches (docs/BENCHMARKS.md), so not in decode.cu.
template <int W>
__global__ void __launch_bounds__(32 * W)
    fused_attn(const bf *q, const bf *k, const bf *v, const uint32_t *pos, float *part, bf *out,
               uint32_t *counters, int hkv, int cap, int chunk, float scale) {
    decode_attention_keys<bf, D, G, W>(q, k, v, pos, part, hkv, cap, chunk, scale);
    merge_if_last(part, out, counters, hkv);
}
// The whole chunk staged in shared memory before any arithmetic: a block of W warps takes its split's keys 32 W at a time;
// every thread first issues its share of the tile's keys and values as
// 16-byte cp.async copies (two groups, keys first), so the block has its
// whole tile in flight at once instead of one warp-load after another.
// Rows are padded to 272 bytes so that a lane reading its own key row and
// a warp reading one value row are both free of bank conflicts. Scores:
// one key a lane against the queries (f32, in shared memory); values: 4
// dimensions a lane. With FUSE the last split block of a (row, KV head)
// merges the splits (merge_if_last). Measured in session 20: faster than
// decode_attention_keys only on the longest rows.
constexpr int ROWB = D * 2 + 16; // a padded row, bytes
template <int W, bool FUSE>
__global__ void __launch_bounds__(32 * W)
    staged_attn(const bf *q, const bf *k, const bf *v, const uint32_t *pos, float *part, bf *out,
                uint32_t *counters, int hkv, int cap, int chunk, float scale) {
    constexpr int CH = 32 * W, NV = D / 32;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char *ks = smem, *vs = smem + CH * ROWB;
    float(*qs)[D] = reinterpret_cast<float(*)[D]>(smem + 2 * CH * ROWB);
    __shared__ float s_m[W][G], s_l[W][G];
    const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int len = (int)pos[b] + 1;
    const int per = (len + splits - 1) / splits;
    const int c = max(chunk, (per + 63) / 64 * 64);
    const int start = split * c, end = min(start + c, len);
    float *o = part + (((size_t)b * hkv + h) * splits + split) * G * (D + 2);
    const bf *kb = k + ((size_t)b * hkv + h) * cap * D;
    const bf *vb = v + ((size_t)b * hkv + h) * cap * D;
    float m[G], l[G], acc[G][NV];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < NV; ++e) acc[g][e] = 0.f;
    }
    if (start < end) {
        for (int t0 = start; t0 < end; t0 += CH) {
            const int n = min(CH, end - t0);
            // 16 pieces of 16 bytes a row.
            for (int i = tid; i < n * 16; i += 32 * W)
                cp_async16(ks + (i >> 4) * ROWB + (i & 15) * 16, kb + (size_t)(t0 + (i >> 4)) * D + (i & 15) * 8);
            asm volatile("cp.async.commit_group;\n" ::);
            for (int i = tid; i < n * 16; i += 32 * W)
                cp_async16(vs + (i >> 4) * ROWB + (i & 15) * 16, vb + (size_t)(t0 + (i >> 4)) * D + (i & 15) * 8);
            asm volatile("cp.async.commit_group;\n" ::);
            if (t0 == start) {
                const int hq = hkv * G;
                for (int i = tid; i < G * D; i += 32 * W)
                    qs[i / D][i % D] = __bfloat162float(q[((size_t)b * hq + h * G) * D + i]) * scale;
            }
            asm volatile("cp.async.wait_group 1;\n" ::);
            __syncthreads();
            const int key = warp * 32 + lane;
            const bool valid = key < n;
            const uint4 *kr = reinterpret_cast<const uint4 *>(ks + (valid ? key : 0) * ROWB);
            float s[G];
#pragma unroll
            for (int g = 0; g < G; ++g) s[g] = 0.f;
#pragma unroll 4
            for (int d8 = 0; d8 < D / 8; ++d8) {
                const uint4 raw = kr[d8];
                const __nv_bfloat162 *h2 = reinterpret_cast<const __nv_bfloat162 *>(&raw);
                float kv[8];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 f = __bfloat1622float2(h2[e]);
                    kv[2 * e] = f.x, kv[2 * e + 1] = f.y;
                }
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    const float4 a = *reinterpret_cast<const float4 *>(&qs[g][d8 * 8]);
                    const float4 bq = *reinterpret_cast<const float4 *>(&qs[g][d8 * 8 + 4]);
                    s[g] += a.x * kv[0] + a.y * kv[1] + a.z * kv[2] + a.w * kv[3] + bq.x * kv[4] + bq.y * kv[5] +
                            bq.z * kv[6] + bq.w * kv[7];
                }
            }
            float p[G];
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float x = valid ? s[g] : -INFINITY;
                const float mn = fmaxf(m[g], warp_max(x));
                if (mn == -INFINITY) { // this warp has no key in the tile
                    p[g] = 0.f;
                    continue;
                }
                const float corr = __expf(m[g] - mn);
                p[g] = valid ? __expf(x - mn) : 0.f;
                l[g] = l[g] * corr + warp_sum(p[g]);
#pragma unroll
                for (int e = 0; e < NV; ++e) acc[g][e] *= corr;
                m[g] = mn;
            }
            asm volatile("cp.async.wait_group 0;\n" ::);
            __syncthreads();
            const int nk = min(32, n - warp * 32);
            for (int j = 0; j < nk; ++j) {
                const uint2 raw = *reinterpret_cast<const uint2 *>(vs + (warp * 32 + j) * ROWB + lane * 8);
                const __nv_bfloat162 *h2 = reinterpret_cast<const __nv_bfloat162 *>(&raw);
                const float2 v0 = __bfloat1622float2(h2[0]), v1 = __bfloat1622float2(h2[1]);
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    const float pj = __shfl_sync(0xffffffffu, p[g], j);
                    acc[g][0] += pj * v0.x, acc[g][1] += pj * v0.y, acc[g][2] += pj * v1.x, acc[g][3] += pj * v1.y;
                }
            }
            __syncthreads(); // the tile's buffers are free
        }
        // Merge the warps through the key buffer.
        float(*s_acc)[G][D] = reinterpret_cast<float(*)[G][D]>(smem);
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
        merge_warps<G, D, W>(s_m, s_l, s_acc, o);
    } else if (tid < G) {
        o[tid * (D + 2) + 1] = 0.f;
    }
    if (FUSE) merge_if_last(part, out, counters, hkv);
}
template <int W> constexpr int staged_smem() { return 2 * 32 * W * ROWB + G * D * 4; }

// Split-KV attention on tensor cores: decode_attention_mma of decode.cu,
// which the decode step runs on bf16 models (TRACE_TRAIN_DECODE_ATTENTION).
template <int W>
__global__ void __launch_bounds__(32 * W)
    tc_attn(const bf *q, const bf *k, const bf *v, const uint32_t *pos, float *part, int hkv, int cap, int chunk,
            float scale) {
    decode_attention_mma<D, G, W>(q, k, v, pos, part, hkv, cap, chunk, scale);
}
template <int W> constexpr int tc_smem() { return decode_attention_mma_smem(D, W); }
// Reads the same keys and values as the attention blocks, coalesced, and
// nothing else: what the card gives this access pattern.
__global__ void probe(const bf *k, const bf *v, const uint32_t *pos, float *part, int cap, int chunk) {
    const int h = blockIdx.x, b = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int len = (int)pos[b] + 1;
    const int per = (len + splits - 1) / splits;
    const int c = max(chunk, (per + 63) / 64 * 64);
    const int start = split * c, end = min(start + c, len);
    if (start >= end) return;
    const uint4 *kb = reinterpret_cast<const uint4 *>(k + (((size_t)b * HKV + h) * cap + start) * D);
    const uint4 *vb = reinterpret_cast<const uint4 *>(v + (((size_t)b * HKV + h) * cap + start) * D);
    const int n = (end - start) * D / 8;
    uint32_t acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const uint4 a = kb[i], bb = vb[i];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ bb.x ^ bb.y ^ bb.z ^ bb.w;
    }
    if (acc == 0x12345678u) part[0] = 1.f;
}
__global__ void combine(const float *part, bf *out, int hkv, int group, int splits) {
    attention_combine<bf>(part, out, hkv, group, splits);
}
__global__ void fill(bf *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 4.f);
    }
}

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e = (x);                                                                      \
        if (e != cudaSuccess) {                                                                   \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));                     \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

struct Run {
    int kind; // 0 old, 1/2/4 new with W warps, 14 new with 4 warps and the combine folded in,
              // 15/16 staged with 4/2 warps and the combine folded in, 17 staged with 4 warps,
              // 20 tensor cores with 4 warps, 9/10 probe
    int chunk;
};

static uint32_t *g_counters; // one a (row, KV head), zero between launches

static void launch(Run r, const bf *q, const bf *k, const bf *v, const uint32_t *pos, float *part, bf *out) {
    const int splits = std::min(16, std::max(1, CAP / r.chunk));
    const float scale = 1.f / sqrtf((float)D);
    dim3 grid(HKV, B, splits);
    switch (r.kind) {
    case 0: old_attn<<<grid, ATTN_THREADS>>>(q, k, v, pos, part, HKV, CAP, r.chunk, scale); break;
    case 1: new_attn<1><<<grid, 32>>>(q, k, v, pos, part, HKV, CAP, r.chunk, scale); break;
    case 2: new_attn<2><<<grid, 64>>>(q, k, v, pos, part, HKV, CAP, r.chunk, scale); break;
    case 4: new_attn<4><<<grid, 128>>>(q, k, v, pos, part, HKV, CAP, r.chunk, scale); break;
    case 14:
        fused_attn<4><<<grid, 128>>>(q, k, v, pos, part, out, g_counters, HKV, CAP, r.chunk, scale);
        return;
    case 15:
        staged_attn<4, true><<<grid, 128, staged_smem<4>()>>>(q, k, v, pos, part, out, g_counters, HKV, CAP,
                                                                r.chunk, scale);
        return;
    case 16:
        staged_attn<2, true><<<grid, 64, staged_smem<2>()>>>(q, k, v, pos, part, out, g_counters, HKV, CAP,
                                                               r.chunk, scale);
        return;
    case 17:
        staged_attn<4, false><<<grid, 128, staged_smem<4>()>>>(q, k, v, pos, part, out, g_counters, HKV, CAP,
                                                                 r.chunk, scale);
        break;
    case 20: tc_attn<4><<<grid, 128, tc_smem<4>()>>>(q, k, v, pos, part, HKV, CAP, r.chunk, scale); break;
    case 9: probe<<<grid, 128>>>(k, v, pos, part, CAP, r.chunk); return;
    case 10: probe<<<grid, 256>>>(k, v, pos, part, CAP, r.chunk); return;
    }
    combine<<<dim3(HKV * G, B), D>>>(part, out, HKV, G, splits);
}

int main() {
    const size_t per = (size_t)B * HKV * CAP * D;
    bf *k, *v, *q, *out, *ref;
    float *part;
    uint32_t *pos;
    CK(cudaMalloc(&k, per * LAYERS * sizeof(bf)));
    CK(cudaMalloc(&v, per * LAYERS * sizeof(bf)));
    CK(cudaMalloc(&q, (size_t)B * HKV * G * D * sizeof(bf)));
    CK(cudaMalloc(&out, (size_t)B * HKV * G * D * sizeof(bf)));
    CK(cudaMalloc(&ref, (size_t)B * HKV * G * D * sizeof(bf)));
    CK(cudaMalloc(&part, (size_t)B * HKV * 16 * G * (D + 2) * sizeof(float)));
    CK(cudaMalloc(&pos, B * sizeof(uint32_t)));
    CK(cudaMalloc(&g_counters, B * HKV * sizeof(uint32_t)));
    CK(cudaMemset(g_counters, 0, B * HKV * sizeof(uint32_t)));
    CK(cudaFuncSetAttribute(staged_attn<4, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, staged_smem<4>()));
    CK(cudaFuncSetAttribute(staged_attn<4, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, staged_smem<4>()));
    CK(cudaFuncSetAttribute(staged_attn<2, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, staged_smem<2>()));
    CK(cudaFuncSetAttribute(tc_attn<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, tc_smem<4>()));
    fill<<<1024, 256>>>(k, per * LAYERS, 1);
    fill<<<1024, 256>>>(v, per * LAYERS, 2);
    fill<<<64, 256>>>(q, (size_t)B * HKV * G * D, 3);
    CK(cudaDeviceSynchronize());
    std::vector<Run> runs = {{0, 64}, {1, 32}, {1, 64}, {2, 64}, {2, 128}, {4, 128}, {4, 256}, {14, 128}, {14, 256}, {15, 128}, {16, 64}, {17, 128}, {20, 128}, {20, 256}, {9, 64}};
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int lens[] = {128, 266, 384, 511, -1};
    for (int L : lens) {
        std::vector<uint32_t> hp(B);
        for (int b = 0; b < B; ++b) hp[b] = L > 0 ? L - 1 : 255 + (b * 97) % 256; // -1: mixed 256..511
        CK(cudaMemcpy(pos, hp.data(), B * 4, cudaMemcpyHostToDevice));
        double bytes = 0;
        for (int b = 0; b < B; ++b) bytes += 2.0 * HKV * (hp[b] + 1) * D * sizeof(bf);
        launch(runs[0], q, k, v, pos, part, ref);
        CK(cudaDeviceSynchronize());
        std::vector<bf> hr((size_t)B * HKV * G * D), ho(hr.size());
        CK(cudaMemcpy(hr.data(), ref, hr.size() * sizeof(bf), cudaMemcpyDeviceToHost));
        for (Run r : runs) {
            launch(r, q, k, v, pos, part, out);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(ho.data(), out, ho.size() * sizeof(bf), cudaMemcpyDeviceToHost));
            float err = 0, mx = 0;
            for (size_t i = 0; i < hr.size(); ++i) {
                err = fmaxf(err, fabsf(__bfloat162float(hr[i]) - __bfloat162float(ho[i])));
                mx = fmaxf(mx, fabsf(__bfloat162float(hr[i])));
            }
            const int reps = 40;
            cudaEventRecord(e0);
            for (int i = 0; i < reps; ++i) {
                const int l = i % LAYERS;
                launch(r, q, k + per * l, v + per * l, pos, part, out);
            }
            cudaEventRecord(e1);
            CK(cudaEventSynchronize(e1));
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            const double us = 1e3 * ms / reps;
            printf("len %4d kind %d chunk %3d: %6.2f us (attention + combine) %6.0f GB/s  max err %.2e of %.2e\n", L,
                   r.kind, r.chunk, us, bytes / us * 1e-3, err, mx);
        }
    }
    CK(cudaGetLastError());
    return 0;
}
