// The decode step's matrix products (src/model/fast_decode.rs): Y = X W^T
// for the few rows of a decode batch (M <= 32) against a weight of many
// rows. At M = 32 reading the weight is the whole cost; the tensor-core
// work is a thin strip beside it.
//
// One kernel for three weight formats:
// - bf16 rows (out, in) read as they are;
// - NF4 (bitsandbytes' layout, model/nf4.rs): two codes a byte, the first
//   in the high nibble, read as they are, a quarter of bf16's bytes. Each
//   64-block's absmax comes from a small table made once a generation
//   (`nf4_scales`: f16, chunk-major, so one 4-byte load gives a thread the
//   scales of its two columns).
// - FP8 (layers/fp8.rs): E4M3 codes, a byte each, half of bf16's bytes,
//   with one f32 scale a row of W (an output column of Y), applied to the
//   sums before the LoRA update. A pair of codes becomes bf16 exactly:
//   the hardware's conversion to f16, the exponent and mantissa moved to
//   bf16's places (every E4M3 value is normal or zero in f16), and one
//   product by 2^112 to undo the exponent's bias.
//
// The work: a block of 4 warps owns 128 weight rows (a "tile") and a range
// of 64-column chunks of K (a "split"); each warp owns 32 of the rows as 4
// n8 B fragments of mma.sync m16n8k16 against X's rows as A fragments.
// Inside a chunk the columns are taken in a thread-local order: thread
// (g, q) of the warp (g = lane / 4, q = lane % 4) holds columns q*16 ..
// q*16+15 of its weight row and of its X rows, and the 4 k-steps of 16
// read them 4 at a time. Both operands use the same order, so the sum is
// X W^T, and a thread's loads are 32 (bf16), 16 (FP8) or 8 (NF4)
// contiguous bytes.
// The weight loads of the next U chunks are issued before the current
// ones are multiplied (two register buffers). When the block's range of
// K is short enough, X's rows for it are copied to shared memory first,
// so that no chunk waits for them.
//
// With more than one split, each block writes f32 partial sums and the
// last block of a tile to finish (a counter a tile) adds them in split
// order, all its threads at once, so the result does not depend on which
// block finished last; it resets the counter for the next launch (graph
// replays included).
//
// An optional LoRA update is added at the end: y[m, n] += sum_j xa[m, seg r
// + j] * lb[n, j], with xa = X A^T computed before (all segments' A
// stacked) and lb the segment's B already multiplied by the scale; the
// rank a multiple of 8.
//
// Up to three segments (q, k and v; gate and up) are separate weights
// written to consecutive column ranges of Y; a tile never straddles two.

#include "common.cuh"
#include <cuda_fp8.h>

#define SK_WARPS 4
#define SK_NT 4
#define SK_TILE (SK_WARPS * SK_NT * 8)
#define SK_THREADS (SK_WARPS * 32)
// Copies of the NF4 byte-pair table in shared memory (lane l reads copy
// l % SK_LUT_COPIES), which keeps bank conflicts of random bytes low.
#define SK_LUT_COPIES 8

// The weight formats.
#define FMT_BF16 0
#define FMT_NF4 1
#define FMT_FP8 2
// 32-bit words of a chunk's 16 columns a thread holds for one weight row.
#define SK_WORDS(F) ((F) == FMT_BF16 ? 8 : (F) == FMT_NF4 ? 2 : 4)

__device__ __forceinline__ uint32_t word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

struct Segs {
    const void *w[3];       // bf16 rows, NF4 packed codes or E4M3 codes
    const void *scales[3];  // NF4: (K / 64, rows) f16 absmax; FP8: (rows,) f32
    int rows[3];            // rows of each segment (0: absent)
};

// Two E4M3 codes (the first in the low byte) as bf16x2, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t pair) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xffffu), __NV_E4M3);
    const uint32_t u = (uint32_t)h.x | ((uint32_t)h.y << 16);
    // Each half's exponent and top 7 mantissa bits in bf16's places: the
    // value times 2^-112 (f16's exponent bias against bf16's), normal in
    // bf16 for every E4M3 value; the product restores it.
    const uint32_t b = ((u >> 3) & 0x0fff0fffu) | (u & 0x80008000u);
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&b),
                                     __floats2bfloat162_rn(0x1p112f, 0x1p112f));
    return *reinterpret_cast<const uint32_t *>(&v);
}

// The weight words of one chunk a thread holds for its SK_NT rows
// (SK_WORDS each), and for NF4 the f16 scales of the two columns (rows) it
// accumulates in each n8 tile.
template <int F> struct Chunk {
    uint32_t w[SK_NT][SK_WORDS(F)];
    uint32_t scale[F == FMT_NF4 ? SK_NT : 1];
};

template <int F>
__device__ __forceinline__ void load_chunk(Chunk<F> &out, const void *wseg, const void *scales_v, int k,
                                           int seg_rows, int wrow, int g, int q, int c, bool live) {
    const __half *scales = reinterpret_cast<const __half *>(scales_v);
#pragma unroll
    for (int i = 0; i < SK_NT; ++i) {
        const int n = wrow + i * 8 + g;
        if (live && n < seg_rows) {
            if constexpr (F == FMT_FP8) {
                const uint4 v = __ldcs(reinterpret_cast<const uint4 *>((const uint8_t *)wseg + (size_t)n * k +
                                                                       (size_t)c * 64 + q * 16));
                out.w[i][0] = v.x, out.w[i][1] = v.y, out.w[i][2] = v.z, out.w[i][3] = v.w;
            } else if constexpr (F == FMT_NF4) {
                const uint2 v = __ldcs(reinterpret_cast<const uint2 *>(
                    (const uint8_t *)wseg + ((size_t)n * k + (size_t)c * 64) / 2 + q * 8));
                out.w[i][0] = v.x;
                out.w[i][1] = v.y;
            } else {
                const uint4 *p = reinterpret_cast<const uint4 *>((const __nv_bfloat16 *)wseg + (size_t)n * k +
                                                                 (size_t)c * 64 + q * 16);
                const uint4 a = __ldcs(p), b = __ldcs(p + 1);
                out.w[i][0] = a.x, out.w[i][1] = a.y, out.w[i][2] = a.z, out.w[i][3] = a.w;
                out.w[i][4] = b.x, out.w[i][5] = b.y, out.w[i][6] = b.z, out.w[i][7] = b.w;
            }
        } else {
#pragma unroll
            for (int e = 0; e < SK_WORDS(F); ++e) out.w[i][e] = 0;
        }
        if (F == FMT_NF4) {
            // Columns 2q, 2q + 1 of the tile: rows n2, n2 + 1 (rows come
            // in pairs: every segment has an even number).
            const int n2 = wrow + i * 8 + 2 * q;
            out.scale[i] = live && n2 < seg_rows
                               ? __ldg(reinterpret_cast<const unsigned int *>(scales + (size_t)c * seg_rows + n2))
                               : 0u;
        }
    }
}

template <int MT, int F>
__device__ __forceinline__ void multiply_chunk(float (&acc)[SK_NT][MT][4], const Chunk<F> &ch,
                                               const __nv_bfloat16 *const (&xrow)[2 * MT],
                                               const bool (&xok)[2 * MT], int c, const uint32_t *pair_lut,
                                               int lane) {
    uint4 xv[2 * MT][2];
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
        if (xok[i]) {
            const uint4 *p = reinterpret_cast<const uint4 *>(xrow[i] + (size_t)c * 64);
            xv[i][0] = p[0];
            xv[i][1] = p[1];
        } else {
            xv[i][0] = xv[i][1] = make_uint4(0, 0, 0, 0);
        }
    }
    constexpr bool NF4 = F == FMT_NF4;
    float t[SK_NT][MT][4];
    if (NF4) {
#pragma unroll
        for (int i = 0; i < SK_NT; ++i)
#pragma unroll
            for (int j = 0; j < MT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) t[i][j][e] = 0.f;
    }
    const int copy = lane % SK_LUT_COPIES;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        uint32_t b[SK_NT][2];
#pragma unroll
        for (int i = 0; i < SK_NT; ++i) {
            if constexpr (F == FMT_FP8) {
                // Columns 4s .. 4s + 3 of the thread's 16, as bf16's words
                // 2s and 2s + 1 hold them.
                b[i][0] = e4m3x2_to_bf16x2(ch.w[i][s]);
                b[i][1] = e4m3x2_to_bf16x2(ch.w[i][s] >> 16);
            } else if constexpr (NF4) {
                const uint32_t w = ch.w[i][s >> 1];
                const int shift = (s & 1) * 16;
                b[i][0] = pair_lut[((w >> shift) & 0xff) * SK_LUT_COPIES + copy];
                b[i][1] = pair_lut[((w >> (shift + 8)) & 0xff) * SK_LUT_COPIES + copy];
            } else {
                b[i][0] = ch.w[i][2 * s];
                b[i][1] = ch.w[i][2 * s + 1];
            }
        }
#pragma unroll
        for (int j = 0; j < MT; ++j) {
            const int h = s >> 1, o = (s & 1) * 2;
            const uint32_t a0 = word(xv[2 * j][h], o), a2 = word(xv[2 * j][h], o + 1);
            const uint32_t a1 = word(xv[2 * j + 1][h], o), a3 = word(xv[2 * j + 1][h], o + 1);
#pragma unroll
            for (int i = 0; i < SK_NT; ++i) mma_bf16(NF4 ? t[i][j] : acc[i][j], a0, a1, a2, a3, b[i][0], b[i][1]);
        }
    }
    if (NF4) {
        // A 64-block has one absmax a row: scale the chunk's sums.
#pragma unroll
        for (int i = 0; i < SK_NT; ++i) {
            const __half2 sc = *reinterpret_cast<const __half2 *>(&ch.scale[i]);
            const float s0 = __low2float(sc), s1 = __high2float(sc);
#pragma unroll
            for (int j = 0; j < MT; ++j) {
                acc[i][j][0] = fmaf(t[i][j][0], s0, acc[i][j][0]);
                acc[i][j][1] = fmaf(t[i][j][1], s1, acc[i][j][1]);
                acc[i][j][2] = fmaf(t[i][j][2], s0, acc[i][j][2]);
                acc[i][j][3] = fmaf(t[i][j][3], s1, acc[i][j][3]);
            }
        }
    }
}

// sum over 8 of a[i] b[i], both 8 bf16 values.
__device__ __forceinline__ float dot8(const uint4 &a, const uint4 &b) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t wa = word(a, i), wb = word(b, i);
        const float2 fa = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&wa));
        const float2 fb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&wb));
        s = fmaf(fa.x, fb.x, s);
        s = fmaf(fa.y, fb.y, s);
    }
    return s;
}

// The LoRA update of R rows x C columns a thread owns, added to out[r][c]:
// sum_j xa[row_r, seg r + j] lb[col0 + n_c, j], 8 values of j at a time
// (every load of a group issued before any is used). rank % 8 == 0.
template <int R, int C>
__device__ __forceinline__ void add_lora(float (&out)[R][C], const int (&rows)[R], const int (&ns)[C], int col0,
                                         int seg, const __nv_bfloat16 *__restrict__ xa, int xa_stride,
                                         const __nv_bfloat16 *__restrict__ lb, int rank, int m, int seg_rows) {
    for (int j = 0; j < rank; j += 8) {
        uint4 a[R], b[C];
#pragma unroll
        for (int i = 0; i < R; ++i)
            a[i] = rows[i] < m ? __ldg(reinterpret_cast<const uint4 *>(xa + (size_t)rows[i] * xa_stride + seg * rank + j))
                               : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int c = 0; c < C; ++c)
            b[c] = ns[c] < seg_rows ? __ldg(reinterpret_cast<const uint4 *>(lb + (size_t)(col0 + ns[c]) * rank + j))
                                    : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int c = 0; c < C; ++c) out[i][c] += dot8(a[i], b[c]);
    }
}

template <int MT, int F>
__device__ __forceinline__ void skinny(const __nv_bfloat16 *__restrict__ x, int m, int k,
                                       __nv_bfloat16 *__restrict__ y, int ldy, const Segs &segs, int splits,
                                       int chunks_per_split, bool x_in_shared, float *__restrict__ part,
                                       uint32_t *__restrict__ counters, const __nv_bfloat16 *__restrict__ xa,
                                       int xa_stride, const __nv_bfloat16 *__restrict__ lb, int r) {
    // NF4: byte -> its two codes as bf16x2 (the high nibble, the lower
    // column, in the low half).
    constexpr bool NF4 = F == FMT_NF4;
    __shared__ uint32_t pair_lut[NF4 ? 256 * SK_LUT_COPIES : 1];
    __shared__ uint32_t last_flag;
    // X's rows for the block's chunks, when they fit (dynamic size): read
    // once, then every warp's fragments come from shared memory.
    extern __shared__ uint4 x_shared[];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    // The tile's segment, its first row there, its first output column.
    int t = blockIdx.x, seg = 0, col0 = 0;
    while (seg < 2) {
        const int tiles = (segs.rows[seg] + SK_TILE - 1) / SK_TILE;
        if (t < tiles) break;
        t -= tiles;
        col0 += segs.rows[seg];
        ++seg;
    }
    const int row0 = t * SK_TILE;
    const int seg_rows = segs.rows[seg];
    const void *wseg = segs.w[seg];
    const void *scales = segs.scales[seg];
    const int wrow = row0 + warp * (SK_NT * 8);  // the warp's first row in the segment

    if (NF4) {
        const float nf4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                               -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                               0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                               0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                               0.7229568362236023f, 1.0f};
        for (int i = threadIdx.x; i < 256 * SK_LUT_COPIES; i += SK_THREADS) {
            const int byte = i / SK_LUT_COPIES;
            const __nv_bfloat16 first = __float2bfloat16_rn(nf4[byte >> 4]);
            const __nv_bfloat16 second = __float2bfloat16_rn(nf4[byte & 15]);
            pair_lut[i] = (uint32_t)__bfloat16_as_ushort(first) | ((uint32_t)__bfloat16_as_ushort(second) << 16);
        }
        __syncthreads();
    }

    const int chunks = k / 64;
    const int c_begin = blockIdx.y * chunks_per_split;
    const int c_end = min(c_begin + chunks_per_split, chunks);

    float acc[SK_NT][MT][4];
#pragma unroll
    for (int i = 0; i < SK_NT; ++i)
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    // Where X's rows are read: shared memory (row stride `span` + 8
    // values, so the 8 lanes of a 16-byte load phase hit distinct banks),
    // or global memory through L1.
    const int span = (c_end - c_begin) * 64;
    const __nv_bfloat16 *xsrc = x;
    int xstride = k, xcol = 0;
    if (x_in_shared) {
        const int stride = span + 8;
        __nv_bfloat16 *xs = reinterpret_cast<__nv_bfloat16 *>(x_shared);
        const int per_row = span / 8;  // uint4s
        for (int i = threadIdx.x; i < 32 * per_row; i += SK_THREADS) {
            const int row = i / per_row, col = (i % per_row) * 8;
            const uint4 v = row < m ? __ldg(reinterpret_cast<const uint4 *>(x + (size_t)row * k + c_begin * 64 + col))
                                    : make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4 *>(xs + row * stride + col) = v;
        }
        __syncthreads();
        xsrc = xs;
        xstride = stride;
        xcol = c_begin * 64;
    }
    // Rows of X this thread feeds: g, g + 8 (, g + 16, g + 24); chunk c
    // at xrow[i] + c * 64.
    const __nv_bfloat16 *xrow[2 * MT];
    bool xok[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) {
        const int row = g + 8 * i;
        xok[i] = row < m;
        xrow[i] = xsrc + (size_t)(xok[i] ? row : 0) * xstride + q * 16 - xcol;
    }

    constexpr int U = F == FMT_BF16 ? 1 : 2;  // chunks a buffer holds
    Chunk<F> buf[2][U];
#pragma unroll
    for (int u = 0; u < U; ++u)
        load_chunk<F>(buf[0][u], wseg, scales, k, seg_rows, wrow, g, q, c_begin + u, c_begin + u < c_end);
    for (int c0 = c_begin; c0 < c_end; c0 += 2 * U) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int base = c0 + half * U;
            if (base >= c_end) break;
            // Issue the next U chunks' loads, then multiply these.
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = base + U + u;
                load_chunk<F>(buf[half ^ 1][u], wseg, scales, k, seg_rows, wrow, g, q, c, c < c_end);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (base + u < c_end) multiply_chunk<MT, F>(acc, buf[half][u], xrow, xok, base + u, pair_lut, lane);
            }
        }
    }

    // Accumulator (i, j, e) is row j*16 + g + 8*(e >= 2), column
    // wrow + i*8 + 2q + (e & 1) of the segment.
    if (F == FMT_FP8) {
        // Each column's scale (rows come in pairs: one 8-byte load).
        const float *sc = reinterpret_cast<const float *>(scales);
#pragma unroll
        for (int i = 0; i < SK_NT; ++i) {
            const int n = wrow + i * 8 + 2 * q;
            const float2 s = n < seg_rows ? __ldg(reinterpret_cast<const float2 *>(sc + n)) : make_float2(0.f, 0.f);
#pragma unroll
            for (int j = 0; j < MT; ++j) {
                acc[i][j][0] *= s.x;
                acc[i][j][1] *= s.y;
                acc[i][j][2] *= s.x;
                acc[i][j][3] *= s.y;
            }
        }
    }
    if (splits == 1) {
        // Rows j*16 + g + 8h as (j, h), columns i*8 + 2q + e as (i, e).
        float v[2 * MT][2 * SK_NT];
        int rows[2 * MT], ns[2 * SK_NT];
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                rows[2 * j + h] = j * 16 + g + 8 * h;
#pragma unroll
                for (int i = 0; i < SK_NT; ++i)
#pragma unroll
                    for (int e = 0; e < 2; ++e) v[2 * j + h][2 * i + e] = acc[i][j][2 * h + e];
            }
#pragma unroll
        for (int i = 0; i < SK_NT; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) ns[2 * i + e] = wrow + i * 8 + 2 * q + e;
        if (xa) add_lora<2 * MT, 2 * SK_NT>(v, rows, ns, col0, seg, xa, xa_stride, lb, r, m, seg_rows);
#pragma unroll
        for (int a = 0; a < 2 * MT; ++a) {
            if (rows[a] >= m) continue;
#pragma unroll
            for (int c = 0; c < 2 * SK_NT; ++c)
                if (ns[c] < seg_rows) y[(size_t)rows[a] * ldy + col0 + ns[c]] = __float2bfloat16_rn(v[a][c]);
        }
        return;
    }

    // Partial sums: (split, 32 rows, ldy) f32.
    float *mine = part + (size_t)blockIdx.y * 32 * ldy;
#pragma unroll
    for (int i = 0; i < SK_NT; ++i) {
        const int n = wrow + i * 8 + 2 * q;
        if (n >= seg_rows) continue;
#pragma unroll
        for (int j = 0; j < MT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = j * 16 + g + 8 * h;
                if (row >= m) continue;
                __stcg(reinterpret_cast<float2 *>(mine + (size_t)row * ldy + col0 + n),
                       make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]));
            }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last_flag = atomicAdd(&counters[blockIdx.x], 1u) == (uint32_t)(splits - 1);
    __syncthreads();
    if (!last_flag) return;
    __threadfence();
    // The last block adds every split's sums of the tile, in split order:
    // thread t takes 4 columns (t % 32) of rows t / 32, + 4, ... (8 rows),
    // every load of a split issued before any is used.
    const int cols = min(SK_TILE, seg_rows - row0);
    const int cq = (threadIdx.x & 31) * 4;
    const int r0 = threadIdx.x >> 5;
    float4 sum[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) sum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (cq < cols) {
        for (int s = 0; s < splits; ++s) {
            const float *p = part + (size_t)s * 32 * ldy + col0 + row0 + cq;
            float4 v[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int row = r0 + 4 * i;
                v[i] = row < m ? __ldcg(reinterpret_cast<const float4 *>(p + (size_t)row * ldy))
                               : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                sum[i].x += v[i].x;
                sum[i].y += v[i].y;
                sum[i].z += v[i].z;
                sum[i].w += v[i].w;
            }
        }
        float v[8][4];
        int rows[8], ns[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            rows[i] = r0 + 4 * i;
            v[i][0] = sum[i].x, v[i][1] = sum[i].y, v[i][2] = sum[i].z, v[i][3] = sum[i].w;
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) ns[e] = row0 + cq + e;
        if (xa) add_lora<8, 4>(v, rows, ns, col0, seg, xa, xa_stride, lb, r, m, seg_rows);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (rows[i] >= m) continue;
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (ns[e] < seg_rows) y[(size_t)rows[i] * ldy + col0 + ns[e]] = __float2bfloat16_rn(v[i][e]);
        }
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}

#define SKINNY_KERNEL(NAME, MT, F)                                                                         \
    extern "C" __global__ void __launch_bounds__(SK_THREADS) NAME(                                      \
        const __nv_bfloat16 *x, int m, int k, __nv_bfloat16 *y, int ldy, const void *w0, const void *w1, \
        const void *w2, const void *s0, const void *s1, const void *s2, int r0, int r1, int r2,          \
        int splits, int chunks_per_split, int x_in_shared, float *part, uint32_t *counters,             \
        const __nv_bfloat16 *xa, int xa_stride, const __nv_bfloat16 *lb, int r) {                        \
        const Segs segs{{w0, w1, w2}, {s0, s1, s2}, {r0, r1, r2}};                                        \
        skinny<MT, F>(x, m, k, y, ldy, segs, splits, chunks_per_split, x_in_shared != 0, part,         \
                        counters, xa, xa_stride, lb, r);                                                 \
    }

SKINNY_KERNEL(skinny_bf16_m16, 1, FMT_BF16)
SKINNY_KERNEL(skinny_bf16_m32, 2, FMT_BF16)
SKINNY_KERNEL(skinny_nf4_m16, 1, FMT_NF4)
SKINNY_KERNEL(skinny_nf4_m32, 2, FMT_NF4)
SKINNY_KERNEL(skinny_fp8_m16, 1, FMT_FP8)
SKINNY_KERNEL(skinny_fp8_m32, 2, FMT_FP8)

// The f16 absmax of every 64-block of an NF4 weight of `rows` rows and
// `chunks` blocks a row, chunk-major: out[c * rows + n] (the decode
// product reads two rows' scales of a chunk with one load). From the
// double quantisation: map[code] * nested[block / 256] + offset, each
// product and sum rounded to f32 as the dequantisation does. Grid
// (ceil(rows / 256), chunks), block 256.
extern "C" __global__ void nf4_scales(const uint8_t *codes, const float *nested, const float *map, float offset,
                                      int rows, int chunks, __half *out) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    const int c = blockIdx.y;
    if (n >= rows) return;
    const size_t block = (size_t)n * chunks + c;
    const float absmax = __fadd_rn(__fmul_rn(map[codes[block]], nested[block / 256]), offset);
    out[(size_t)c * rows + n] = __float2half_rn(absmax);
}
