// NF4 dequantisation with double-quantised block maxima (see src/model/nf4.rs
// for the format). One thread turns 8 packed bytes into 16 values and writes
// them with 16-byte stores. Products and sums use the _rn intrinsics so nvcc
// cannot fuse them into FMAs: the result matches the CPU path bit for bit.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define NF4_BLOCK_SHIFT 2    // 4 groups of 16 values a 64-block
#define NESTED_BLOCK_SHIFT 8 // 256 64-blocks a nested block
#define MAP_LEN 256
#define LUT_LEN (MAP_LEN + 16)

__device__ __forceinline__ void store16(float *out, uint64_t group, const float *v) {
    float4 *dst = reinterpret_cast<float4 *>(out) + group * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        dst[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    }
}

__device__ __forceinline__ uint32_t pack2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}

__device__ __forceinline__ uint32_t pack2(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

__device__ __forceinline__ void store16(__nv_bfloat16 *out, uint64_t group, const float *v) {
    uint4 *dst = reinterpret_cast<uint4 *>(out) + group * 2;
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        w[i] = pack2(__float2bfloat16_rn(v[2 * i]), __float2bfloat16_rn(v[2 * i + 1]));
    }
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

__device__ __forceinline__ void store16(__half *out, uint64_t group, const float *v) {
    uint4 *dst = reinterpret_cast<uint4 *>(out) + group * 2;
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        w[i] = pack2(__float2half_rn(v[2 * i]), __float2half_rn(v[2 * i + 1]));
    }
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// packed: groups * 8 bytes (8-byte aligned); absmax_codes: one a 64-block;
// nested_absmax: one a 256 64-blocks; lut: the 256 dynamic-map values then
// the 16 NF4 codes; out: groups * 16 values (16-byte aligned).
template <typename T>
__device__ __forceinline__ void nf4_dequantize(const uint8_t *__restrict__ packed,
                                               const uint8_t *__restrict__ absmax_codes,
                                               const float *__restrict__ nested_absmax,
                                               const float *__restrict__ lut, float offset,
                                               uint64_t groups, T *__restrict__ out) {
    __shared__ float s_lut[LUT_LEN];
    for (int i = threadIdx.x; i < LUT_LEN; i += blockDim.x) {
        s_lut[i] = lut[i];
    }
    __syncthreads();
    const float *code = s_lut + MAP_LEN;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        const uint64_t block = g >> NF4_BLOCK_SHIFT;
        const float absmax = __fadd_rn(
            __fmul_rn(s_lut[absmax_codes[block]], nested_absmax[block >> NESTED_BLOCK_SHIFT]),
            offset);
        const uint2 bytes = reinterpret_cast<const uint2 *>(packed)[g];
        float v[16];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t lo = (bytes.x >> (8 * i)) & 0xff;
            const uint32_t hi = (bytes.y >> (8 * i)) & 0xff;
            v[2 * i] = __fmul_rn(code[lo >> 4], absmax);
            v[2 * i + 1] = __fmul_rn(code[lo & 0xf], absmax);
            v[8 + 2 * i] = __fmul_rn(code[hi >> 4], absmax);
            v[8 + 2 * i + 1] = __fmul_rn(code[hi & 0xf], absmax);
        }
        store16(out, g, v);
    }
}

#define NF4_KERNEL(name, T)                                                                      \
    extern "C" __global__ void name(const uint8_t *__restrict__ packed,                          \
                                    const uint8_t *__restrict__ absmax_codes,                    \
                                    const float *__restrict__ nested_absmax,                     \
                                    const float *__restrict__ lut, float offset, uint64_t groups, \
                                    T *__restrict__ out) {                                       \
        nf4_dequantize<T>(packed, absmax_codes, nested_absmax, lut, offset, groups, out);        \
    }

NF4_KERNEL(nf4_dequantize_f32, float)
NF4_KERNEL(nf4_dequantize_bf16, __nv_bfloat16)
NF4_KERNEL(nf4_dequantize_f16, __half)
