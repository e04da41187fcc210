// The softmax of inference attention (see src/model/attention.rs): scores in
// the model's dtype in, probabilities in the model's dtype out, one pass. It
// replaces five candle ops (cast to f32, scale, add the mask, softmax, cast
// back), each a kernel launch and a pass over the scores, with one; the
// arithmetic is the same (f32, as HF's eager attention).

#include "common.cuh"

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

// A contiguous copy of a strided (A, X, Y, R) view whose rows of R
// elements are contiguous and 16-byte aligned (a head-transposed q, k, v
// or attention output): 16 bytes a thread, `v` of them a row. `s0`, `s1`,
// `s2` are the view's strides in 16-byte units; out[(a, x, y)] =
// in[a s0 + x s1 + y s2]. candle's strided copy computes an index per
// element; rows of 256 bytes move at the card's bandwidth this way.
extern "C" __global__ void copy_rows_16(const uint4 *__restrict__ in, uint4 *__restrict__ out, long long n,
                                        int x, int y, int v, long long s0, long long s1, long long s2) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / v;
        const int e = (int)(i - row * v);
        const int yi = (int)(row % y);
        const long long r2 = row / y;
        const int xi = (int)(r2 % x);
        const long long a = r2 / x;
        out[i] = in[a * s0 + xi * s1 + yi * s2 + e];
    }
}
