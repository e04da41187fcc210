// The tensor-core building blocks of the benches that try decode product
// kernels (tc_decode_gemm.cu, pdl_decode_layer.cu, stream_decode.cuh) beyond
// those of src/kernels/common.cuh (smem_u32, cp_async16, cp_async_commit,
// cp_async_wait, ldmatrix_x4_trans, mma_bf16): a zero-filling copy,
// ldmatrix, mma.sync on whole fragments and the swizzle of a stage of
// 128-byte rows.
#pragma once

#include "../src/kernels/common.cuh"

// As cp_async16, but only `bytes` (0 or 16) are read; the rest of the 16 are
// zeros (a row beyond the batch).
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}

// d += a b: a 16 x 16 bf16 (row), b 16 x 8 bf16 (col), d 16 x 8 f32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    mma_bf16(d, a[0], a[1], a[2], a[3], b0, b1);
}

// Byte offset of 16-byte segment `seg` (0..7) of row `row` in a stage of
// 128-byte rows, swizzled so that ldmatrix's eight rows hit eight banks.
__host__ __device__ __forceinline__ int swz128(int row, int seg) { return row * 128 + ((seg ^ (row & 7)) << 4); }

// acc += one 64-column stage: this warp's 16 rows of W (`w`, 128-byte rows,
// swz128) times the stage's NT x 8 rows of X (`x`, laid out the same)
// transposed. acc[j][0..1]: W row lane/4, X rows j*8 + (lane%4)*2 + {0,1};
// acc[j][2..3]: W row lane/4 + 8. NT is even.
template <int NT>
__device__ __forceinline__ void mma_stage(float (&acc)[NT][4], const unsigned char *w, const unsigned char *x,
                                          int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        {
            // Lanes 0-15: rows 0-15 at k 0; lanes 16-31: rows 0-15 at k 8.
            const int r = warp * 16 + (lane & 15), seg = kk * 2 + (lane >> 4);
            ldmatrix_x4(a[0], a[1], a[2], a[3], w + swz128(r, seg));
        }
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            // Matrices: (X rows j*8.., k 0), (j*8.., k 8), (j*8+8.., k 0), (j*8+8.., k 8).
            const int r = j * 8 + (lane & 7) + ((lane >> 4) << 3), seg = kk * 2 + ((lane >> 3) & 1);
            uint32_t b0, b1, b2, b3;
            ldmatrix_x4(b0, b1, b2, b3, x + swz128(r, seg));
            mma_bf16(acc[j], a, b0, b1);
            mma_bf16(acc[j + 1], a, b2, b3);
        }
    }
}
