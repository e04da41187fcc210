// Does Programmatic Dependent Launch (PDL) let the batch-32 decode step's
// weight products run nearer the card's bandwidth than cuBLAS does?
//
// The program models a stack of Qwen3-4B decoder layers (hidden 2560, bf16,
// M = 32 rows, 36 layers by default), each layer with its own weights and
// its own stand-in KV cache, so nothing a layer reads is still in L2 when it
// is read. A layer is a chain of kernels, each reading the previous one's
// output:
//   add+RMSNorm -> qkv product (6144 x 2560) -> attention stand-in (reads a
//   50 MB cache) -> combine -> o product (2560 x 4096) -> add+RMSNorm ->
//   gate/up product (19456 x 2560) -> silu_mul -> down product (2560 x 9728)
// and the down product's output is the next layer's h.
//
// Variants (each captured into one CUDA graph for the whole stack):
//   A  cublas            products by cublasGemmEx, ordinary launches
//   B  ours              the tensor-core kernel of benches/tc_decode_gemm.cu
//                        (split sums added by a second small kernel)
//   C  ours+pdl          every kernel launched with programmatic stream
//                        serialization; small kernels signal their dependents
//                        at once; a product loads the W part of all its
//                        pipeline stages before griddepcontrol.wait, and
//                        signals its dependents only after its main loop
//   D  ours+pdl+l2       C, and before the wait each product CTA prefetches
//                        more of its own W range into L2
//                        (prefetch.global.L2::evict_last, one a 128-byte
//                        line), at most PDL_L2_MB (default 24) MB a product
//   E  cublas+pdl-small  cuBLAS products, small kernels with PDL
//   F  ours+pdl+l2n      D with prefetch.global.L2 (no eviction priority),
//                        in case evict_last lines crowd out later data
// Each variant runs once eagerly and once from its graph; the final h is
// checked against variant A's eager result. Then the graph is replayed
// (3 warm-up, 20 timed) and the mean per stack and per layer is printed.
//
//   export CUDA_HOME=/opt/cuda13 PATH=/opt/cuda13/bin:$PATH
//   nvcc -O3 -arch=sm_90 -std=c++17 -c benches/pdl_decode_layer.cu -o /tmp/pdl.o
//   g++ /tmp/pdl.o -o /tmp/pdl -L$CUDA_HOME/lib64 -lcublas -lcudart
//   /tmp/pdl [layers=36] [variants=ABCDEF]      e.g. /tmp/pdl 36 ABC
// Needs about 9.2 GB of GPU memory at 36 layers (sm_90: PDL needs Hopper).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <string>
#include <vector>
#include <algorithm>

#include "../src/kernels/common.cuh"

typedef __nv_bfloat16 bf16;

#define CK(x) do { auto r_ = (x); if (r_ != 0) { printf("error %d at %s:%d\n", (int)r_, __FILE__, __LINE__); exit(1); } } while (0)
// Inside the code that enqueues a stack: report and give up on the variant.
#define TRY(x) do { auto r_ = (x); if (r_ != 0) { printf("  enqueue failed: %s -> error %d (%s) at line %d\n", #x, (int)r_, errname(r_), __LINE__); return false; } } while (0)
static const char *errname(cudaError_t e) { return cudaGetErrorString(e); }
static const char *errname(cublasStatus_t) { return "cublas status"; }

// ---------------------------------------------------------------- shapes
constexpr int M = 32;                  // decode rows
constexpr int HID = 2560;              // hidden size
constexpr int NQKV = 6144, NO = 2560, NGU = 19456, NDOWN = 2560;
constexpr int KQKV = 2560, KO = 4096, KGU = 2560, KDOWN = 9728;
constexpr int FFN = NGU / 2;           // 9728: gate is columns [0, FFN), up [FFN, 2 FFN)
constexpr int QH = 32, KVH = 8, G = QH / KVH, HD = 128;  // attention heads
constexpr int KEYS = 384, ATT_SPLITS = 4, ATT_THREADS = 128;
constexpr size_t CACHE_PLANE = (size_t)M * KVH * KEYS * HD;  // elements of K (and of V)
constexpr size_t W_QKV = (size_t)NQKV * KQKV, W_O = (size_t)NO * KO, W_GU = (size_t)NGU * KGU,
                 W_DOWN = (size_t)NDOWN * KDOWN, W_LAYER = W_QKV + W_O + W_GU + W_DOWN;
constexpr double BW = 3.35e12;         // H100 SXM bandwidth, bytes/s

// ---------------------------------------------------------------- PDL
// Both instructions are no-ops in a kernel launched without the attribute.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// ---------------------------------------------------------------- helpers
// load8 / store8: 8 values a 16-byte load or store (src/kernels/common.cuh).

// Uniform values in [offset - scale/2, offset + scale/2) from a hash of the index.
__global__ void fill(bf16 *p, size_t n, uint64_t seed, float scale, float offset) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t h = (i + (seed << 40)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 29;
    p[i] = __float2bfloat16(((float)(h & 0xffffff) / 16777216.f - 0.5f) * scale + offset);
  }
}

// ---------------------------------------------------------------- small kernels
// Every small kernel lets its dependents launch at once and waits for the
// previous kernel before reading anything (every block, before any exit).

// x += h (rounded to bf16), out = rmsnorm(x) * w. Grid M, block HID / 8.
__global__ void __launch_bounds__(HID / 8) add_rmsnorm(bf16 *x, const bf16 *h, const bf16 *w, bf16 *out) {
  pdl_trigger();
  pdl_wait();
  __shared__ float warp_sums[HID / 8 / 32];
  const int i = threadIdx.x * 8;
  bf16 *xr = x + (size_t)blockIdx.x * HID;
  float xv[8], hv[8], wv[8];
  load8(xr + i, xv);
  load8(h + (size_t)blockIdx.x * HID + i, hv);
  load8(w + i, wv);
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < 8; e++) {
    xv[e] = __bfloat162float(__float2bfloat16(xv[e] + hv[e]));
    ss += xv[e] * xv[e];
  }
  store8(xr + i, xv);
#pragma unroll
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < HID / 8 / 32; k++) total += warp_sums[k];
  const float r = rsqrtf(total / HID + 1e-6f);
#pragma unroll
  for (int e = 0; e < 8; e++) xv[e] *= r * wv[e];
  store8(out + (size_t)blockIdx.x * HID + i, xv);
}

// act = silu(gate) * up, gate and up the two halves of a gate/up row.
// Grid (ceil(FFN / 8 / 256), M), block 256.
__global__ void silu_mul(const bf16 *gu, bf16 *act) {
  pdl_trigger();
  pdl_wait();
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8, b = blockIdx.y;
  if (i >= FFN) return;
  float g[8], u[8];
  load8(gu + (size_t)b * NGU + i, g);
  load8(gu + (size_t)b * NGU + FFN + i, u);
#pragma unroll
  for (int e = 0; e < 8; e++) g[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
  store8(act + (size_t)b * FFN + i, g);
}

// Attention stand-in, bound by reading the layer's cache once. Block
// (kv head h, row b, split s) reads keys [s * KEYS / ATT_SPLITS, +KEYS /
// ATT_SPLITS) of the row's K and V planes (each key 128 dims, 256 bytes,
// read by 16 lanes with one 16-byte load each; the two halves of a warp
// read adjacent keys) and, for each of the G query heads sharing that kv
// head, sums sigmoid(q . k) / KEYS * v over its keys. Not real attention:
// only a kernel of the right size that depends on both qkv and the cache.
// Writes f32 partial sums part[b][q head][s][HD]. Grid (KVH, M, ATT_SPLITS).
__global__ void __launch_bounds__(ATT_THREADS) attention_standin(const bf16 *qkv, const bf16 *cache, float *part) {
  pdl_trigger();
  pdl_wait();
  constexpr int GROUPS = ATT_THREADS / 16, PER = KEYS / ATT_SPLITS, U = 4;
  static_assert(PER % (GROUPS * U) == 0, "keys per block");
  __shared__ float red[GROUPS][G * HD];
  const int h = blockIdx.x, b = blockIdx.y, s = blockIdx.z;
  const int grp = threadIdx.x >> 4, lane = threadIdx.x & 15;
  float q[G][8], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    load8(qkv + (size_t)b * NQKV + (h * G + g) * HD + lane * 8, q[g]);
#pragma unroll
    for (int e = 0; e < 8; e++) acc[g][e] = 0.f;
  }
  const bf16 *kb = cache + ((size_t)b * KVH + h) * KEYS * HD + lane * 8;
  const bf16 *vb = kb + CACHE_PLANE;
  for (int t0 = s * PER + grp; t0 < (s + 1) * PER; t0 += GROUPS * U) {
    // U keys' K and V in flight before any is used.
    uint4 kr[U], vr[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      kr[u] = *reinterpret_cast<const uint4 *>(kb + (size_t)(t0 + u * GROUPS) * HD);
      vr[u] = *reinterpret_cast<const uint4 *>(vb + (size_t)(t0 + u * GROUPS) * HD);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      float k[8], v[8], sc[G];
      load8(reinterpret_cast<const bf16 *>(&kr[u]), k);
      load8(reinterpret_cast<const bf16 *>(&vr[u]), v);
#pragma unroll
      for (int g = 0; g < G; g++) {
        sc[g] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) sc[g] += q[g][e] * k[e];
      }
      // Sum each score over the key's 16 lanes (a half warp).
#pragma unroll
      for (int o = 8; o; o >>= 1)
#pragma unroll
        for (int g = 0; g < G; g++) sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], o);
#pragma unroll
      for (int g = 0; g < G; g++) {
        const float p = 1.f / (KEYS * (1.f + __expf(-sc[g])));
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] += p * v[e];
      }
    }
  }
  // Add the groups' sums.
#pragma unroll
  for (int g = 0; g < G; g++)
#pragma unroll
    for (int e = 0; e < 8; e++) red[grp][g * HD + lane * 8 + e] = acc[g][e];
  __syncthreads();
  for (int i = threadIdx.x; i < G * HD; i += ATT_THREADS) {
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < GROUPS; k++) sum += red[k][i];
    const int g = i / HD, d = i % HD;
    part[(((size_t)b * QH + h * G + g) * ATT_SPLITS + s) * HD + d] = sum;
  }
}

// attn[b][qh * HD + d] = bf16(sum over splits of part). Grid M * QH * HD / 256, block 256.
__global__ void attention_combine(const float *part, bf16 *attn) {
  pdl_trigger();
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int d = i % HD, bq = i / HD;  // bq = b * QH + qh
  float sum = 0.f;
#pragma unroll
  for (int s = 0; s < ATT_SPLITS; s++) sum += part[((size_t)bq * ATT_SPLITS + s) * HD + d];
  attn[i] = __float2bfloat16(sum);
}

// Y = bf16(sum over splits of part), four elements a thread.
__global__ void add_splits(const float *__restrict__ part, bf16 *__restrict__ Y, int total, int splits) {
  pdl_trigger();
  pdl_wait();
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i >= total) return;
  float4 s = *reinterpret_cast<const float4 *>(part + i);
  for (int k = 1; k < splits; k++) {
    const float4 v = *reinterpret_cast<const float4 *>(part + (size_t)k * total + i);
    s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
  }
  Y[i] = __float2bfloat16(s.x); Y[i + 1] = __float2bfloat16(s.y);
  Y[i + 2] = __float2bfloat16(s.z); Y[i + 3] = __float2bfloat16(s.w);
}

// ---------------------------------------------------------------- the product
// Y[M, N] = X[M, K] W[N, K]^T, copied from benches/tc_decode_gemm.cu (see
// there): a CTA takes 16 x WARPS rows of W over a range of K chunks, streams
// W and X through STAGES cp.async slots and feeds mma.sync from ldmatrix.
constexpr int KC = 64;  // K elements a stage (128 bytes a row)

// cp.async, ldmatrix, mma.sync and the stage swizzle: the decode kernels' own.
#include "mma.cuh"

// MODE 0: the kernel of tc_decode_gemm.cu as it is (no griddepcontrol).
// MODE 1: before griddepcontrol.wait, the W part of chunks 0..STAGES-1 is
//   loaded into all STAGES slots (one commit group; W never depends on an
//   earlier kernel); after the wait, X of chunks 0..STAGES-2, then the usual
//   pipeline, which loads only X for chunk STAGES-1 (its W is in place).
//   Dependents are let launch after the main loop, before the epilogue.
// MODE 2: as 1, and before the wait the CTA prefetches into L2 up to
//   l2_lines 128-byte lines of its own W range beyond chunk STAGES-1, in the
//   order the main loop will read them (chunk by chunk, all rows), with
//   prefetch.global.L2::evict_last (evict_last != 0) or prefetch.global.L2.
template <int WARPS, int STAGES, int MODE>
__global__ void __launch_bounds__(32 * WARPS) decode_gemm(const bf16 *__restrict__ X, const bf16 *__restrict__ W,
                                                          bf16 *__restrict__ Y, float *__restrict__ part, int N, int K,
                                                          int l2_lines, int evict_last) {
  constexpr int ROWS = 16 * WARPS;
  constexpr int W_BYTES = ROWS * 128, X_BYTES = M * 128, STAGE_BYTES = W_BYTES + X_BYTES;
  constexpr int THREADS = 32 * WARPS;
  constexpr int NT = M / 8;  // n8 tiles of X rows
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int row0 = blockIdx.x * ROWS;
  const int chunks = K / KC, splits = gridDim.y, split = blockIdx.y;
  const int c_begin = split * chunks / splits, c_end = (split + 1) * chunks / splits;
  const int n_chunks = c_end - c_begin;

  auto load_w = [&](int c, int slot) {
    unsigned char *s = smem + slot * STAGE_BYTES;
    const int k0 = (c_begin + c) * KC;
#pragma unroll
    for (int i = tid; i < ROWS * 8; i += THREADS) {
      const int r = i >> 3, seg = i & 7;
      cp_async16(s + swz128(r, seg), W + (size_t)(row0 + r) * K + k0 + seg * 8);
    }
  };
  auto load_x = [&](int c, int slot) {
    unsigned char *s = smem + slot * STAGE_BYTES;
    const int k0 = (c_begin + c) * KC;
#pragma unroll
    for (int i = tid; i < M * 8; i += THREADS) {
      const int r = i >> 3, seg = i & 7;
      cp_async16(s + W_BYTES + swz128(r, seg), X + (size_t)r * K + k0 + seg * 8);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[j][e] = 0.f;

  if constexpr (MODE == 0) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < n_chunks) { load_w(s, s); load_x(s, s); }
      cp_async_commit();
    }
  } else {
    // Weights first: they do not depend on the previous kernel.
#pragma unroll
    for (int s = 0; s < STAGES; s++)
      if (s < n_chunks) load_w(s, s);
    cp_async_commit();
    if constexpr (MODE == 2) {
      const int rest = max(n_chunks - STAGES, 0);
      const int lines = min(rest * ROWS, l2_lines);
      for (int i = tid; i < lines; i += THREADS) {
        const int c = STAGES + i / ROWS, r = i % ROWS;
        const bf16 *a = W + (size_t)(row0 + r) * K + (size_t)(c_begin + c) * KC;
        if (evict_last) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(a));
        else asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
      }
    }
    pdl_wait();
    // Commit groups: [W 0..S-1], [X 0], ..., [X S-2], then one a loop turn.
    // At turn c, wait_group S-2 leaves the first c + 2 complete: W of the
    // first S chunks and X (and W) of chunk c, as in MODE 0.
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < n_chunks) load_x(s, s);
      cp_async_commit();
    }
  }
  for (int c = 0; c < n_chunks; c++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    // The slot of chunk c - 1, which every warp has finished with.
    const int next = c + STAGES - 1;
    if (next < n_chunks) {
      if (MODE == 0 || next >= STAGES) load_w(next, next % STAGES);
      load_x(next, next % STAGES);
    }
    cp_async_commit();
    const unsigned char *s = smem + (c % STAGES) * STAGE_BYTES;
    const unsigned char *sx = s + W_BYTES;
    mma_stage<NT>(acc, s, sx, warp, lane);
  }
  cp_async_wait<0>();
  if constexpr (MODE != 0) pdl_trigger();

  // acc[j][0..1]: W row lane/4, X rows j*8 + (lane%4)*2 + {0,1}; [2..3]: W row lane/4 + 8.
  const int n = row0 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < NT; j++) {
    const int m = j * 8 + (lane & 3) * 2;
    if (splits == 1) {
      Y[(size_t)m * N + n] = __float2bfloat16(acc[j][0]);
      Y[(size_t)(m + 1) * N + n] = __float2bfloat16(acc[j][1]);
      Y[(size_t)m * N + n + 8] = __float2bfloat16(acc[j][2]);
      Y[(size_t)(m + 1) * N + n + 8] = __float2bfloat16(acc[j][3]);
    } else {
      float *p = part + (size_t)split * M * N;
      p[(size_t)m * N + n] = acc[j][0];
      p[(size_t)(m + 1) * N + n] = acc[j][1];
      p[(size_t)m * N + n + 8] = acc[j][2];
      p[(size_t)(m + 1) * N + n + 8] = acc[j][3];
    }
  }
}

// ---------------------------------------------------------------- launching
// One launch through cudaLaunchKernelEx, with the PDL attribute when `pdl`.
template <typename... Params, typename... Args>
cudaError_t launch(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                   Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// A product's shape and the tc kernel's configuration for it (the best of
// each in isolation, from tc_decode_gemm.cu at M = 32).
struct Product { const char *name; int N, K, warps, stages, splits; };
const Product P_QKV = {"qkv", NQKV, KQKV, 4, 6, 2}, P_O = {"o", NO, KO, 8, 4, 6},
              P_GU = {"gate/up", NGU, KGU, 4, 4, 1}, P_DOWN = {"down", NDOWN, KDOWN, 4, 4, 6};
const Product PRODUCTS[4] = {P_QKV, P_O, P_GU, P_DOWN};

static double g_l2_mb = 24.0;  // the L2 prefetch budget of a product (MODE 2)

template <int WARPS, int STAGES>
constexpr int gemm_smem() { return STAGES * (16 * WARPS * 128 + M * 128); }

template <int WARPS, int STAGES>
void configure_gemm() {
  constexpr int S = gemm_smem<WARPS, STAGES>();
  CK(cudaFuncSetAttribute(decode_gemm<WARPS, STAGES, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, S));
  CK(cudaFuncSetAttribute(decode_gemm<WARPS, STAGES, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, S));
  CK(cudaFuncSetAttribute(decode_gemm<WARPS, STAGES, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, S));
}

// The product and (with splits) its reduce. mode as decode_gemm's MODE;
// pdl: launch both with the attribute.
template <int WARPS, int STAGES>
cudaError_t tc_product(const Product &p, int mode, bool pdl, int evict_last, const bf16 *X, const bf16 *W, bf16 *Y,
                       float *part, cudaStream_t st) {
  constexpr int SMEM = gemm_smem<WARPS, STAGES>();
  const dim3 grid(p.N / (16 * WARPS), p.splits);
  const int ctas = grid.x * grid.y;
  const int l2_lines = (int)(g_l2_mb * 1048576.0 / ctas / 128);
  cudaError_t e;
  if (mode == 0)
    e = launch(pdl, decode_gemm<WARPS, STAGES, 0>, grid, dim3(32 * WARPS), SMEM, st, X, W, Y, part, p.N, p.K, l2_lines, evict_last);
  else if (mode == 1)
    e = launch(pdl, decode_gemm<WARPS, STAGES, 1>, grid, dim3(32 * WARPS), SMEM, st, X, W, Y, part, p.N, p.K, l2_lines, evict_last);
  else
    e = launch(pdl, decode_gemm<WARPS, STAGES, 2>, grid, dim3(32 * WARPS), SMEM, st, X, W, Y, part, p.N, p.K, l2_lines, evict_last);
  if (e != cudaSuccess || p.splits == 1) return e;
  const int total = M * p.N;
  return launch(pdl, add_splits, dim3((total / 4 + 255) / 256), dim3(256), 0, st, (const float *)part, Y, total,
                p.splits);
}

cudaError_t tc_dispatch(const Product &p, int mode, bool pdl, int evict_last, const bf16 *X, const bf16 *W, bf16 *Y,
                        float *part, cudaStream_t st) {
  if (p.warps == 4 && p.stages == 6) return tc_product<4, 6>(p, mode, pdl, evict_last, X, W, Y, part, st);
  if (p.warps == 8 && p.stages == 4) return tc_product<8, 4>(p, mode, pdl, evict_last, X, W, Y, part, st);
  if (p.warps == 4 && p.stages == 4) return tc_product<4, 4>(p, mode, pdl, evict_last, X, W, Y, part, st);
  printf("no instantiation for warps %d stages %d\n", p.warps, p.stages);
  exit(1);
}

// ---------------------------------------------------------------- the model
struct Layer { bf16 *wqkv, *wo, *wgu, *wdown, *norm1, *norm2, *cache; };
struct Acts {
  bf16 *x, *h, *x0, *h0;             // residual and the layer's output; their initial values
  bf16 *n, *qkv, *attn, *o, *gu, *act;
  float *part, *apart;               // split sums of the products; of the attention
};

struct Variant {
  char id;
  const char *name;
  bool cublas;      // products by cuBLAS
  bool pdl_small;   // small kernels with the PDL attribute
  int mode;         // tc kernel MODE (ours only)
  int evict_last;   // L2 prefetch flavour (MODE 2)
};
const Variant VARIANTS[] = {
    {'A', "cublas", true, false, 0, 0},        {'B', "ours", false, false, 0, 0},
    {'C', "ours+pdl", false, true, 1, 0},      {'D', "ours+pdl+l2", false, true, 2, 1},
    {'E', "cublas+pdl-small", true, true, 0, 0}, {'F', "ours+pdl+l2n", false, true, 2, 0},
};

struct Model {
  int layers;
  std::vector<Layer> L;
  Acts a;
  cublasHandle_t blas;
  cudaStream_t st;
};

// Y[M, N] = X W^T by cuBLAS (column-major: Y^T = W X^T).
static cublasStatus_t cublas_product(Model &m, const Product &p, const bf16 *X, const bf16 *W, bf16 *Y) {
  const float alpha = 1, beta = 0;
  return cublasGemmEx(m.blas, CUBLAS_OP_T, CUBLAS_OP_N, p.N, M, p.K, &alpha, W, CUDA_R_16BF, p.K, X, CUDA_R_16BF,
                      p.K, &beta, Y, CUDA_R_16BF, p.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

// Enqueue the whole stack on m.st; false (with a message) if a launch failed.
static bool enqueue_stack(Model &m, const Variant &v) {
  Acts &a = m.a;
  const bool pdl = v.pdl_small;
  const bool pdl_prod = !v.cublas && v.mode != 0;
  auto product = [&](const Product &p, const bf16 *X, const bf16 *W, bf16 *Y) -> bool {
    if (v.cublas) TRY(cublas_product(m, p, X, W, Y));
    else TRY(tc_dispatch(p, v.mode, pdl_prod, v.evict_last, X, W, Y, a.part, m.st));
    return true;
  };
  for (int l = 0; l < m.layers; l++) {
    const Layer &w = m.L[l];
    TRY(launch(pdl, add_rmsnorm, dim3(M), dim3(HID / 8), 0, m.st, a.x, (const bf16 *)a.h, (const bf16 *)w.norm1, a.n));
    if (!product(P_QKV, a.n, w.wqkv, a.qkv)) return false;
    TRY(launch(pdl, attention_standin, dim3(KVH, M, ATT_SPLITS), dim3(ATT_THREADS), 0, m.st, (const bf16 *)a.qkv,
               (const bf16 *)w.cache, a.apart));
    TRY(launch(pdl, attention_combine, dim3(M * QH * HD / 256), dim3(256), 0, m.st, (const float *)a.apart, a.attn));
    if (!product(P_O, a.attn, w.wo, a.o)) return false;
    TRY(launch(pdl, add_rmsnorm, dim3(M), dim3(HID / 8), 0, m.st, a.x, (const bf16 *)a.o, (const bf16 *)w.norm2, a.n));
    if (!product(P_GU, a.n, w.wgu, a.gu)) return false;
    TRY(launch(pdl, silu_mul, dim3((FFN / 8 + 255) / 256, M), dim3(256), 0, m.st, (const bf16 *)a.gu, a.act));
    if (!product(P_DOWN, a.act, w.wdown, a.h)) return false;
  }
  return true;
}

// Restore x and h to their initial values (outside any graph).
static void reset(Model &m) {
  CK(cudaMemcpyAsync(m.a.x, m.a.x0, (size_t)M * HID * 2, cudaMemcpyDeviceToDevice, m.st));
  CK(cudaMemcpyAsync(m.a.h, m.a.h0, (size_t)M * HID * 2, cudaMemcpyDeviceToDevice, m.st));
}

static std::vector<float> read_h(Model &m) {
  CK(cudaStreamSynchronize(m.st));
  std::vector<bf16> raw((size_t)M * HID);
  CK(cudaMemcpy(raw.data(), m.a.h, raw.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); i++) out[i] = __bfloat162float(raw[i]);
  return out;
}

// max |got - ref| / max |ref|; infinity if got holds a non-finite value.
static double rel_err(const std::vector<float> &ref, const std::vector<float> &got) {
  double maxref = 0, maxerr = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    maxref = std::max(maxref, (double)std::fabs(ref[i]));
    maxerr = std::max(maxerr, (double)std::fabs(ref[i] - got[i]));
  }
  return maxerr / std::max(maxref, 1e-30);
}

int main(int argc, char **argv) {
  Model m;
  m.layers = argc > 1 ? atoi(argv[1]) : 36;
  const std::string want = argc > 2 ? argv[2] : "ABCDEF";
  if (const char *s = getenv("PDL_L2_MB")) g_l2_mb = atof(s);
  if (m.layers < 1) { printf("usage: %s [layers] [variants, e.g. ABCDEF]\n", argv[0]); return 1; }

  int dev;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device %s, %d SMs, sm_%d%d, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor,
         prop.l2CacheSize >> 20);
  if (prop.major < 9) printf("warning: PDL needs sm_90; C-F will not overlap anything here\n");

  configure_gemm<4, 6>();
  configure_gemm<8, 4>();
  configure_gemm<4, 4>();

  // How the tc kernel's grids sit on this card: all four should fit in one wave.
  for (const Product &p : PRODUCTS) {
    int per_sm = 0;
    const int ctas = p.N / (16 * p.warps) * p.splits;
    if (p.warps == 4 && p.stages == 6)
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_gemm<4, 6, 1>, 128, gemm_smem<4, 6>()));
    else if (p.warps == 8)
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_gemm<8, 4, 1>, 256, gemm_smem<8, 4>()));
    else
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_gemm<4, 4, 1>, 128, gemm_smem<4, 4>()));
    const double wmb = (double)p.N * p.K * 2 / 1e6;
    printf("  %-8s N %5d K %5d  %4.1f MB  warps %d stages %d splits %d: %3d CTAs, %d a SM, %.2f waves, "
           "L2 prefetch <= %.0f KB a CTA, ideal %.1f us\n",
           p.name, p.N, p.K, wmb, p.warps, p.stages, p.splits, ctas, per_sm,
           (double)ctas / std::max(1, per_sm * prop.multiProcessorCount), g_l2_mb * 1024 / ctas, wmb * 1e12 / BW);
  }

  // Weights and caches, filled on the device.
  const size_t wbytes = W_LAYER * 2, cbytes = 2 * CACHE_PLANE * 2;
  printf("%d layers: weights %.1f MB and cache %.1f MB a layer, %.2f GB in all\n", m.layers, wbytes / 1e6,
         cbytes / 1e6, (double)m.layers * (wbytes + cbytes) / 1e9);
  m.L.resize(m.layers);
  for (int l = 0; l < m.layers; l++) {
    Layer &w = m.L[l];
    bf16 *p;
    CK(cudaMalloc(&p, wbytes));
    w.wqkv = p; w.wo = p + W_QKV; w.wgu = w.wo + W_O; w.wdown = w.wgu + W_GU;
    fill<<<4 * prop.multiProcessorCount, 256>>>(p, W_LAYER, 1000 + l, 0.02f, 0.f);
    CK(cudaMalloc(&w.norm1, HID * 2));
    CK(cudaMalloc(&w.norm2, HID * 2));
    fill<<<10, 256>>>(w.norm1, HID, 2000 + l, 0.2f, 1.f);
    fill<<<10, 256>>>(w.norm2, HID, 3000 + l, 0.2f, 1.f);
    CK(cudaMalloc(&w.cache, cbytes));
    fill<<<4 * prop.multiProcessorCount, 256>>>(w.cache, 2 * CACHE_PLANE, 4000 + l, 1.f, 0.f);
    CK(cudaGetLastError());
  }
  Acts &a = m.a;
  CK(cudaMalloc(&a.x, M * HID * 2)); CK(cudaMalloc(&a.h, M * HID * 2));
  CK(cudaMalloc(&a.x0, M * HID * 2)); CK(cudaMalloc(&a.h0, M * HID * 2));
  CK(cudaMalloc(&a.n, M * HID * 2)); CK(cudaMalloc(&a.qkv, M * NQKV * 2));
  CK(cudaMalloc(&a.attn, M * QH * HD * 2)); CK(cudaMalloc(&a.o, M * HID * 2));
  CK(cudaMalloc(&a.gu, M * NGU * 2)); CK(cudaMalloc(&a.act, M * FFN * 2));
  size_t part_floats = 0;
  for (const Product &p : PRODUCTS) part_floats = std::max(part_floats, (size_t)p.splits * M * p.N);
  CK(cudaMalloc(&a.part, part_floats * 4));
  CK(cudaMalloc(&a.apart, (size_t)M * QH * ATT_SPLITS * HD * 4));
  fill<<<64, 256>>>(a.x0, M * HID, 7, 2.f, 0.f);
  fill<<<64, 256>>>(a.h0, M * HID, 8, 2.f, 0.f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  CK(cudaStreamCreateWithFlags(&m.st, cudaStreamNonBlocking));
  CK(cublasCreate(&m.blas));
  CK(cublasSetStream(m.blas, m.st));
  void *workspace;
  const size_t ws_bytes = 64u << 20;
  CK(cudaMalloc(&workspace, ws_bytes));
  CK(cublasSetWorkspace(m.blas, workspace, ws_bytes));

  const double ideal_w = wbytes / BW * 1e6, ideal = (wbytes + cbytes) / BW * 1e6;
  printf("ideal a layer at %.2f TB/s: %.1f us (weights %.1f + cache %.1f)\n", BW / 1e12, ideal, ideal_w,
         cbytes / BW * 1e6);

  // The reference: variant A, eagerly.
  reset(m);
  if (!enqueue_stack(m, VARIANTS[0])) { printf("reference run failed\n"); return 1; }
  const std::vector<float> ref = read_h(m);

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int WARM = 3, REPS = 20;
  double t_a = 0;
  bool all_ok = true;
  printf("\n%-3s %-18s %10s %11s %7s %9s\n", "", "variant", "us/layer", "us/stack", "vs A", "rel err");
  for (const Variant &v : VARIANTS) {
    if (want.find(v.id) == std::string::npos) continue;
    // Eagerly.
    reset(m);
    if (!enqueue_stack(m, v)) {
      printf("%c   %-18s skipped: eager launch failed (PDL attribute not accepted?)\n", v.id, v.name);
      cudaGetLastError();
      CK(cudaStreamSynchronize(m.st));
      continue;
    }
    double err = rel_err(ref, read_h(m));
    // Captured into one graph.
    cudaGraph_t graph = nullptr;
    CK(cudaStreamBeginCapture(m.st, cudaStreamCaptureModeThreadLocal));
    const bool ok = enqueue_stack(m, v);
    const cudaError_t end = cudaStreamEndCapture(m.st, &graph);
    if (!ok || end != cudaSuccess) {
      printf("%c   %-18s skipped: capture failed (%s)\n", v.id, v.name, cudaGetErrorString(end));
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      continue;
    }
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphUpload(exec, m.st));
    reset(m);
    CK(cudaGraphLaunch(exec, m.st));
    err = std::max(err, rel_err(ref, read_h(m)));
    // Timed replays (x and h carry on from replay to replay; the norms keep them finite).
    for (int i = 0; i < WARM; i++) CK(cudaGraphLaunch(exec, m.st));
    CK(cudaEventRecord(e0, m.st));
    for (int i = 0; i < REPS; i++) CK(cudaGraphLaunch(exec, m.st));
    CK(cudaEventRecord(e1, m.st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us_stack = ms * 1000.0 / REPS, us_layer = us_stack / m.layers;
    if (v.id == 'A') t_a = us_layer;
    const bool pass = err < 2e-2;
    all_ok &= pass;
    char ratio[16] = "-";
    if (t_a > 0) snprintf(ratio, sizeof ratio, "%.3f", us_layer / t_a);
    printf("%c   %-18s %10.1f %11.1f %7s %9.1e %s   (ideal %.1f us/layer: %.0f%%)\n", v.id, v.name, us_layer,
           us_stack, ratio, err, pass ? "ok" : "FAIL", ideal, 100 * ideal / us_layer);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }
  printf("\n'vs A' is time / time of A (below 1 is faster). rel err: max |h - h_A| / max |h_A| after %d layers,\n"
         "worst of the eager and the graph run. %s\n", m.layers, all_ok ? "All agree." : "Some FAIL.");
  return all_ok ? 0 : 2;
}
