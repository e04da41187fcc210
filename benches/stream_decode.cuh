// An experiment, measured and set aside (docs/BENCHMARKS.md, "A tiled
// weight copy read in one even wave", session 19: 0.55-0.77x cuBLAS on the
// Qwen3-4B layer products, 3,700-3,980 new tokens/s in `bench gen` against
// cuBLAS's 5,340): the decode step's products from a tiled copy of the
// weights, in one even wave. Y = X W^T for up to 32 rows of X (bf16, f32
// sums). benches/stream_decode_gemm.cu times it against cuBLAS.
//
// The copy (`tile_weights_*`): the block of ROWS weight rows x 64 columns
// that one pipeline stage takes (ROWS x 128 bytes) is contiguous and
// already XOR-swizzled as shared memory wants it; blocks follow tile by
// tile, and inside a tile chunk by chunk. A stage is then one contiguous
// read, where W in place gives ROWS segments of 128 bytes a row's length
// apart.
//
// The product (`stream_gemm_w*_s*`): the grid is the blocks that fit on the
// card at once, and block b takes the (tile, chunk) units [U b / G,
// U (b + 1) / G) of the U = tiles x chunks, so every multiprocessor reads
// the same bytes in one wave. Each warp owns 16 of the tile's rows as the
// A operand of mma.sync m16n8k16 (ldmatrix from the stage), X's 32 rows as
// B. A tile one block covers whole is written directly. A tile shared by
// blocks: each writes its f32 sums to its own slot (its place among the
// tile's blocks), and the last to finish (a counter a tile) adds the slots
// in slot order, so the result does not depend on which block finished
// last, and resets the counter for the next launch (graph replays
// included).
#include "mma.cuh"

#define ST_KC 64  // K elements a stage: 128 bytes a row
#define ST_M 32   // X rows a launch (fewer are read as zeros)

// The block that takes unit u: the last b with U b / G <= u.
__device__ __forceinline__ int block_of_unit(long long u, long long units, int grid) {
    return (int)(((u + 1) * grid - 1) / units);
}

// W (n, k) row-major -> the tiled copy, 16 bytes a thread; n a multiple of
// `rows`, k of 64.
template <int ROWS>
__device__ void tile_weights(const __nv_bfloat16 *__restrict__ w, __nv_bfloat16 *__restrict__ out, int n, int k) {
    const int chunks = k / ST_KC;
    const size_t segs = (size_t)n * k / 8;
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < segs; o += (size_t)gridDim.x * blockDim.x) {
        const size_t block = o / (ROWS * 8);
        const int within = (int)(o % (ROWS * 8));
        const int r = within / 8, pos = within % 8;
        const int seg = pos ^ (r & 7);  // swz128 puts segment seg of row r at position seg ^ (r & 7)
        const size_t t = block / chunks, c = block % chunks;
        *reinterpret_cast<uint4 *>(out + o * 8) =
            *reinterpret_cast<const uint4 *>(w + (t * ROWS + r) * (size_t)k + c * ST_KC + seg * 8);
    }
}

extern "C" __global__ void tile_weights_r64(const __nv_bfloat16 *w, __nv_bfloat16 *out, int n, int k) {
    tile_weights<64>(w, out, n, k);
}
extern "C" __global__ void tile_weights_r128(const __nv_bfloat16 *w, __nv_bfloat16 *out, int n, int k) {
    tile_weights<128>(w, out, n, k);
}

// Y (m, n) with row stride ldy = X (m, k) W^T, m <= 32, from the tiled copy
// `wt` (ROWS = 16 WARPS rows a tile). `part`: max_slots x 32 x n f32;
// `counters`: one a tile, zero at the start and left so.
template <int WARPS, int STAGES>
__device__ void stream_gemm(const __nv_bfloat16 *__restrict__ x, int m, int k, const __nv_bfloat16 *__restrict__ wt,
                            __nv_bfloat16 *__restrict__ y, int ldy, int n, float *__restrict__ part,
                            unsigned *__restrict__ counters, int max_slots) {
    constexpr int ROWS = 16 * WARPS;
    constexpr int W_BYTES = ROWS * 128, X_BYTES = ST_M * 128, STAGE_BYTES = W_BYTES + X_BYTES;
    constexpr int THREADS = 32 * WARPS;
    constexpr int NT = ST_M / 8;  // n8 tiles of X rows
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int completes;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int chunks = k / ST_KC;
    const long long units = (long long)(n / ROWS) * chunks;
    const int grid = gridDim.x;
    const long long u0 = units * blockIdx.x / grid, u1 = units * (blockIdx.x + 1) / grid;
    const int n_units = (int)(u1 - u0);
    const unsigned char *wbytes = reinterpret_cast<const unsigned char *>(wt);

    auto load = [&](int i, int slot) {
        const long long u = u0 + i;
        const int k0 = (int)(u % chunks) * ST_KC;
        unsigned char *s = smem + slot * STAGE_BYTES;
        const unsigned char *src = wbytes + u * W_BYTES;
#pragma unroll
        for (int j = tid; j < W_BYTES / 16; j += THREADS) cp_async16(s + j * 16, src + j * 16);
#pragma unroll
        for (int j = tid; j < ST_M * 8; j += THREADS) {
            const int r = j >> 3, seg = j & 7;
            const bool real = r < m;
            cp_async16_zfill(s + W_BYTES + swz128(r, seg), real ? x + (size_t)r * k + k0 + seg * 8 : x, real ? 16 : 0);
        }
    };

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.f;

    // This block's sums of tile t out, acc cleared. Every thread calls it.
    auto flush = [&](int t) {
        const long long first_unit = (long long)t * chunks;
        const int b_first = block_of_unit(first_unit, units, grid);
        const int slots = block_of_unit(first_unit + chunks - 1, units, grid) - b_first + 1;
        // acc[j][0..1]: W row lane/4, X rows j*8 + (lane%4)*2 + {0,1}; [2..3]: W row lane/4 + 8.
        const int col = t * ROWS + warp * 16 + (lane >> 2);
        if (slots == 1) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int r = j * 8 + (lane & 3) * 2;
                if (r < m) {
                    y[(size_t)r * ldy + col] = __float2bfloat16(acc[j][0]);
                    y[(size_t)r * ldy + col + 8] = __float2bfloat16(acc[j][2]);
                }
                if (r + 1 < m) {
                    y[(size_t)(r + 1) * ldy + col] = __float2bfloat16(acc[j][1]);
                    y[(size_t)(r + 1) * ldy + col + 8] = __float2bfloat16(acc[j][3]);
                }
            }
        } else {
            if (slots > max_slots) __trap();  // the host sized `part` too small
            float *p = part + (size_t)(blockIdx.x - b_first) * ST_M * n;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int r = j * 8 + (lane & 3) * 2;
                p[(size_t)r * n + col] = acc[j][0];
                p[(size_t)(r + 1) * n + col] = acc[j][1];
                p[(size_t)r * n + col + 8] = acc[j][2];
                p[(size_t)(r + 1) * n + col + 8] = acc[j][3];
            }
            __threadfence();
            __syncthreads();
            if (tid == 0) completes = atomicAdd(counters + t, 1u) + 1 == (unsigned)slots;
            __syncthreads();
            if (completes) {
                __threadfence();
                for (int j = tid; j < m * ROWS; j += THREADS) {
                    const int r = j / ROWS, c = t * ROWS + j % ROWS;
                    float s = 0.f;
                    for (int q = 0; q < slots; q++) s += __ldcg(part + ((size_t)q * ST_M + r) * n + c);
                    y[(size_t)r * ldy + c] = __float2bfloat16(s);
                }
                if (tid == 0) counters[t] = 0;
            }
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < n_units) load(s, s);
        cp_async_commit();
    }
    int tile = (int)(u0 / chunks);
    for (int i = 0; i < n_units; i++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        // The slot of unit i - 1, which every warp has finished with.
        if (i + STAGES - 1 < n_units) load(i + STAGES - 1, (i + STAGES - 1) % STAGES);
        cp_async_commit();
        const unsigned char *s = smem + (i % STAGES) * STAGE_BYTES;
        const unsigned char *sx = s + W_BYTES;
        mma_stage<NT>(acc, s, sx, warp, lane);
        const int c = (int)((u0 + i) % chunks);
        if (c == chunks - 1 || i == n_units - 1) {
            flush(tile);
            tile++;
        }
    }
    cp_async_wait<0>();
}

#define STREAM_KERNEL(WARPS, STAGES)                                                                               \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) stream_gemm_w##WARPS##_s##STAGES(                    \
        const __nv_bfloat16 *x, int m, int k, const __nv_bfloat16 *wt, __nv_bfloat16 *y, int ldy, int n,          \
        float *part, unsigned *counters, int max_slots) {                                                          \
        stream_gemm<WARPS, STAGES>(x, m, k, wt, y, ldy, n, part, counters, max_slots);                             \
    }

STREAM_KERNEL(4, 4)
STREAM_KERNEL(4, 6)
STREAM_KERNEL(8, 4)
STREAM_KERNEL(8, 6)
