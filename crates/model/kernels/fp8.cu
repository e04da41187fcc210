// FP8 (E4M3) base weights: rows quantised with a scale each, the codes back
// to bf16, and a product's rows and columns rescaled (see
// src/layers/fp8.rs). A row's scale is its largest magnitude over 448, the
// largest finite E4M3 value, so every code is finite; an all-zero row gets
// scale 1. Conversions round to nearest and saturate.

#include "common.cuh"
#include <cuda_fp8.h>

#define E4M3_MAX 448.0f

// Eight bf16 values of a 16-byte load as floats.
__device__ __forceinline__ void unpack8(uint4 u, float *v) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
    const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

// One block a row of x (rows, cols) bf16, cols a multiple of 8 and x 16-byte
// aligned: codes (rows, cols) and scale[row].
extern "C" __global__ void fp8_quantize_rows_bf16(const __nv_bfloat16 *__restrict__ x,
                                                  uint8_t *__restrict__ codes,
                                                  float *__restrict__ scale, uint32_t rows,
                                                  uint32_t cols) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const uint4 *src = reinterpret_cast<const uint4 *>(x + row * cols);
    const uint32_t groups = cols / 8;
    float m = 0.0f;
    for (uint32_t g = threadIdx.x; g < groups; g += blockDim.x) {
        float v[8];
        unpack8(src[g], v);
#pragma unroll
        for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
    }
    m = block_max(m, shared);
    const float s = m > 0.0f ? m / E4M3_MAX : 1.0f;
    if (threadIdx.x == 0) scale[row] = s;
    const float inv = 1.0f / s;
    uint2 *dst = reinterpret_cast<uint2 *>(codes + row * cols);
    for (uint32_t g = threadIdx.x; g < groups; g += blockDim.x) {
        float v[8];
        unpack8(src[g], v);
        dst[g] = make_uint2(e4m3x4(v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv),
                            e4m3x4(v[4] * inv, v[5] * inv, v[6] * inv, v[7] * inv));
    }
}

// The eight values of group g (8 codes) of a (rows, cols) matrix, scaled.
__device__ __forceinline__ void dequantize8(const uint8_t *__restrict__ codes,
                                            const float *__restrict__ scale, uint32_t cols,
                                            uint64_t g, float *v) {
    const float s = scale[(g * 8) / cols];
    const uint2 c = reinterpret_cast<const uint2 *>(codes)[g];
    const uint32_t w[2] = {c.x, c.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> (16 * j)), __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
            v[4 * i + 2 * j] = f.x * s;
            v[4 * i + 2 * j + 1] = f.y * s;
        }
    }
}

// out (rows, cols) bf16 = codes * scale[row]; one thread eight values.
extern "C" __global__ void fp8_dequantize_rows_bf16(const uint8_t *__restrict__ codes,
                                                    const float *__restrict__ scale,
                                                    __nv_bfloat16 *__restrict__ out,
                                                    uint32_t cols, uint64_t groups) {
    const uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    float v[8];
    dequantize8(codes, scale, cols, g, v);
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[i] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i])) |
               ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i + 1])) << 16);
    }
    reinterpret_cast<uint4 *>(out)[g] = make_uint4(o[0], o[1], o[2], o[3]);
}

// The same in f32.
extern "C" __global__ void fp8_dequantize_rows_f32(const uint8_t *__restrict__ codes,
                                                   const float *__restrict__ scale,
                                                   float *__restrict__ out, uint32_t cols,
                                                   uint64_t groups) {
    const uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    float v[8];
    dequantize8(codes, scale, cols, g, v);
    float4 *dst = reinterpret_cast<float4 *>(out) + 2 * g;
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// y (rows, cols) bf16 *= row_scale[row] * col_scale[col], in place: the
// product of codes made with unit scales, rescaled (where cuBLASLt takes no
// per-row and per-column scales). Row blockIdx.y; one thread eight values
// (cols a multiple of 8, y 16-byte aligned).
extern "C" __global__ void fp8_rescale_bf16(__nv_bfloat16 *__restrict__ y,
                                            const float *__restrict__ row_scale,
                                            const float *__restrict__ col_scale, uint32_t cols) {
    const uint32_t g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= cols / 8) return;
    const size_t row = blockIdx.y;
    const float r = row_scale[row];
    uint4 *at = reinterpret_cast<uint4 *>(y + row * cols) + g;
    float v[8];
    unpack8(*at, v);
    const float4 c0 = reinterpret_cast<const float4 *>(col_scale)[2 * g];
    const float4 c1 = reinterpret_cast<const float4 *>(col_scale)[2 * g + 1];
    const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[i] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i] * r * c[2 * i])) |
               ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i + 1] * r * c[2 * i + 1])) << 16);
    }
    *at = make_uint4(o[0], o[1], o[2], o[3]);
}
