// The softmax of inference attention (see src/model/attention.rs): scores in
// the model's dtype in, probabilities in the model's dtype out, one pass. It
// replaces five candle ops (cast to f32, scale, add the mask, softmax, cast
// back), each a kernel launch and a pass over the scores, with one; the
// arithmetic is the same (f32, as HF's eager attention).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ float block_sum(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = lane < warps ? shared[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ float block_max(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = lane < warps ? shared[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// One block a row of t scores; rows are (batch, head, query) with `per_batch`
// = heads * queries rows a batch and `queries` a head. p = softmax(s * scale +
// mask), mask (f32, additive) at mask + b * mask_b + i * mask_i (strides 0 to
// broadcast; null for none).
template <typename T>
__device__ void scaled_masked_softmax(const T *s, const float *mask, T *p, int t, int per_batch,
                                      int queries, long long mask_b, long long mask_i,
                                      float scale) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const int b = (int)(row / per_batch), i = (int)(row % queries);
    s += row * t;
    p += row * t;
    const float *m = mask ? mask + b * mask_b + i * mask_i : nullptr;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < t; j += blockDim.x) {
        const float x = to_f(s[j]) * scale + (m ? m[j] : 0.f);
        mx = fmaxf(mx, x);
    }
    mx = block_max(mx, shared);
    float sum = 0.f;
    for (int j = threadIdx.x; j < t; j += blockDim.x)
        sum += expf(to_f(s[j]) * scale + (m ? m[j] : 0.f) - mx);
    const float inv = 1.f / block_sum(sum, shared);
    for (int j = threadIdx.x; j < t; j += blockDim.x)
        p[j] = from_f<T>(expf(to_f(s[j]) * scale + (m ? m[j] : 0.f) - mx) * inv);
}

#define INSTANTIATE(NAME, T)                                                                      \
    extern "C" __global__ void scaled_masked_softmax_##NAME(                                      \
        const T *s, const float *mask, T *p, int t, int per_batch, int queries,                   \
        long long mask_b, long long mask_i, float scale) {                                        \
        scaled_masked_softmax<T>(s, mask, p, t, per_batch, queries, mask_b, mask_i, scale);       \
    }

INSTANTIATE(f32, float)
INSTANTIATE(bf16, __nv_bfloat16)
INSTANTIATE(f16, __half)
