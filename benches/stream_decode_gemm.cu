// The decode step's products with the weights streamed in one even pass
// (issue 18): Y[M, N] = X[M, K] W[N, K]^T in bf16 with f32 accumulation,
// M = 32 rows (the decode batch), against cuBLAS on the same shapes.
//
// Two changes against benches/tc_decode_gemm.cu's kernel, which reads W in
// place and splits it into tiles x K-splits:
//   1. W is copied once into a tiled layout: the block of ROWS rows x 64
//      columns that one pipeline stage takes (ROWS x 128 bytes) is
//      contiguous, already XOR-swizzled as shared memory wants it, and
//      blocks follow tile by tile, chunk by chunk. A stage is then one
//      contiguous read instead of ROWS segments of 128 bytes, each 5 to
//      19 KB apart.
//   2. The grid is exactly the blocks that fit on the card at once, and
//      each takes an equal, contiguous range of (tile, chunk) units, so
//      every multiprocessor reads the same number of bytes in one wave
//      (the in-place kernel's gate/up grid gives 40 multiprocessors three
//      blocks and 92 two). A tile that a block covers whole is written
//      directly; the partial sums of a tile shared by blocks are added
//      into an f32 buffer, and the block that completes the tile (a
//      counter a tile) writes it and clears the buffer and the counter for
//      the next launch.
// The decode step already keeps a folded copy of the weights for cuBLAS, so
// a tiled copy costs no memory the step does not already spend.
//
// The harness checks every configuration against cublasGemmEx (largest
// error relative to the largest output), times both with the weights
// cycled through several copies so that L2 holds none, and prints the best
// configuration of WARPS {4, 8} x STAGES {4, 6, 8} x blocks a
// multiprocessor {1, 2, 3, 4}, with its share of the card's bandwidth
// (3.35 TB/s, an H100 SXM).
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -c benches/stream_decode_gemm.cu -o sdg.o
//   g++ sdg.o -o sdg -L$CUDA_HOME/lib64 -lcublas -lcudart && ./sdg
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>

#define CK(x) do { auto r_ = (x); if (r_ != 0) { printf("error %d at %s:%d\n", (int)r_, __FILE__, __LINE__); exit(1); } } while (0)

typedef __nv_bfloat16 bf16;
constexpr int KC = 64;  // K elements a stage (128 bytes a row)

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte segment `seg` (0..7) of row `row` in a tile of
// 128-byte rows, swizzled so that ldmatrix's eight rows hit eight banks.
__host__ __device__ __forceinline__ int swz(int row, int seg) { return row * 128 + ((seg ^ (row & 7)) << 4); }

// The tiled copy: 16 bytes a thread. Block b = tile * chunks + chunk holds
// rows [tile * ROWS, +ROWS) x columns [chunk * 64, +64) of W, laid out as a
// stage sits in shared memory (swz).
__global__ void tile_weights(const bf16 *__restrict__ W, bf16 *__restrict__ Wt, int N, int K, int rows) {
  const int chunks = K / KC;
  const size_t segs = (size_t)N * K / 8;
  for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < segs; o += (size_t)gridDim.x * blockDim.x) {
    const size_t block = o / (rows * 8);
    const int within = (int)(o % (rows * 8));
    const int r = within / 8, pos = within % 8;
    const int seg = pos ^ (r & 7);  // swz puts segment seg of row r at position seg ^ (r & 7)
    const size_t t = block / chunks, c = block % chunks;
    const uint4 v = *reinterpret_cast<const uint4 *>(W + (t * rows + r) * K + c * KC + seg * 8);
    *reinterpret_cast<uint4 *>(Wt + o * 8) = v;
  }
}

// One block: units [u0, u1) of tiles x chunks, in order, so its reads of Wt
// are one contiguous range. Yf and counters start at zero and are left so.
template <int M, int WARPS, int STAGES>
__global__ void __launch_bounds__(32 * WARPS) stream_gemm(const bf16 *__restrict__ X, const bf16 *__restrict__ Wt,
                                                          bf16 *__restrict__ Y, float *__restrict__ Yf,
                                                          unsigned *__restrict__ counters, int N, int K) {
  constexpr int ROWS = 16 * WARPS;
  constexpr int W_BYTES = ROWS * 128, X_BYTES = M * 128, STAGE_BYTES = W_BYTES + X_BYTES;
  constexpr int THREADS = 32 * WARPS;
  constexpr int NT = M / 8;  // n8 tiles of X rows
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int completes_tile;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int chunks = K / KC;
  const long long units = (long long)(N / ROWS) * chunks;
  const long long u0 = units * blockIdx.x / gridDim.x, u1 = units * (blockIdx.x + 1) / gridDim.x;
  const int n_units = (int)(u1 - u0);
  const unsigned char *wt = reinterpret_cast<const unsigned char *>(Wt);

  auto load = [&](int i, int slot) {
    const long long u = u0 + i;
    const int k0 = (int)(u % chunks) * KC;
    unsigned char *s = smem + slot * STAGE_BYTES;
    const unsigned char *src = wt + u * W_BYTES;
#pragma unroll
    for (int j = tid; j < W_BYTES / 16; j += THREADS) cp_async16(s + j * 16, src + j * 16);
#pragma unroll
    for (int j = tid; j < M * 8; j += THREADS) {
      const int r = j >> 3, seg = j & 7;
      cp_async16(s + W_BYTES + swz(r, seg), X + (size_t)r * K + k0 + seg * 8);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[j][e] = 0.f;

  // Writes this block's sums of tile t over `count` chunks (all of them
  // when `whole`), then clears acc. Called by every thread of the block.
  auto flush = [&](int t, bool whole, int count) {
    // acc[j][0..1]: W row lane/4, X rows j*8 + (lane%4)*2 + {0,1}; [2..3]: W row lane/4 + 8.
    const int n = t * ROWS + warp * 16 + (lane >> 2);
    if (whole) {
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const int m = j * 8 + (lane & 3) * 2;
        Y[(size_t)m * N + n] = __float2bfloat16(acc[j][0]);
        Y[(size_t)(m + 1) * N + n] = __float2bfloat16(acc[j][1]);
        Y[(size_t)m * N + n + 8] = __float2bfloat16(acc[j][2]);
        Y[(size_t)(m + 1) * N + n + 8] = __float2bfloat16(acc[j][3]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const int m = j * 8 + (lane & 3) * 2;
        atomicAdd(Yf + (size_t)m * N + n, acc[j][0]);
        atomicAdd(Yf + (size_t)(m + 1) * N + n, acc[j][1]);
        atomicAdd(Yf + (size_t)m * N + n + 8, acc[j][2]);
        atomicAdd(Yf + (size_t)(m + 1) * N + n + 8, acc[j][3]);
      }
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        const unsigned before = atomicAdd(counters + t, (unsigned)count);
        completes_tile = before + count == (unsigned)chunks;
      }
      __syncthreads();
      if (completes_tile) {
        __threadfence();
        for (int j = tid; j < M * ROWS; j += THREADS) {
          const size_t idx = (size_t)(j / ROWS) * N + t * ROWS + j % ROWS;
          Y[idx] = __float2bfloat16(__ldcg(Yf + idx));
          Yf[idx] = 0.f;
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
  int tile = (int)(u0 / chunks), first = (int)(u0 % chunks);
  for (int i = 0; i < n_units; i++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    // The slot of unit i - 1, which every warp has finished with.
    if (i + STAGES - 1 < n_units) load(i + STAGES - 1, (i + STAGES - 1) % STAGES);
    cp_async_commit();
    const unsigned char *s = smem + (i % STAGES) * STAGE_BYTES;
    const unsigned char *sx = s + W_BYTES;
#pragma unroll
    for (int kk = 0; kk < KC / 16; kk++) {
      uint32_t a[4];
      {
        // Lanes 0-15: rows 0-15 at k 0; lanes 16-31: rows 0-15 at k 8.
        const int r = warp * 16 + (lane & 15), seg = kk * 2 + (lane >> 4);
        ldmatrix_x4(a[0], a[1], a[2], a[3], s + swz(r, seg));
      }
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        // Matrices: (X rows j*8.., k 0), (j*8.., k 8), (j*8+8.., k 0), (j*8+8.., k 8).
        const int r = j * 8 + (lane & 7) + ((lane >> 4) << 3), seg = kk * 2 + ((lane >> 3) & 1);
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(b0, b1, b2, b3, sx + swz(r, seg));
        mma_bf16(acc[j], a, b0, b1);
        mma_bf16(acc[j + 1], a, b2, b3);
      }
    }
    const int c = (int)((u0 + i) % chunks);
    if (c == chunks - 1 || i == n_units - 1) {
      flush(tile, first == 0 && c == chunks - 1, c - first + 1);
      tile++;
      first = 0;
    }
  }
  cp_async_wait<0>();
}

struct Config {
  int warps, stages, per_sm;
};

// The tiled layout depends on ROWS = 16 x warps: one copy a warp count.
struct Tiled {
  std::vector<bf16 *> copies;
};

template <int M, int WARPS, int STAGES>
bool launch(const bf16 *X, const bf16 *Wt, bf16 *Y, float *Yf, unsigned *counters, int N, int K, int per_sm,
            int sms, cudaStream_t st) {
  constexpr int ROWS = 16 * WARPS, SMEM = STAGES * (ROWS * 128 + M * 128);
  static int fits = -1;
  if (fits < 0) {
    CK(cudaFuncSetAttribute(stream_gemm<M, WARPS, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fits, stream_gemm<M, WARPS, STAGES>, 32 * WARPS, SMEM));
  }
  if (per_sm > fits) return false;
  const long long units = (long long)(N / ROWS) * (K / KC);
  const int grid = (int)std::min<long long>((long long)per_sm * sms, units);
  stream_gemm<M, WARPS, STAGES><<<grid, 32 * WARPS, SMEM, st>>>(X, Wt, Y, Yf, counters, N, K);
  return true;
}

template <int M>
bool run(const Config &c, const bf16 *X, const bf16 *Wt, bf16 *Y, float *Yf, unsigned *counters, int N, int K,
         int sms) {
  const int key = c.warps * 100 + c.stages;
  switch (key) {
    case 404: return launch<M, 4, 4>(X, Wt, Y, Yf, counters, N, K, c.per_sm, sms, 0);
    case 406: return launch<M, 4, 6>(X, Wt, Y, Yf, counters, N, K, c.per_sm, sms, 0);
    case 408: return launch<M, 4, 8>(X, Wt, Y, Yf, counters, N, K, c.per_sm, sms, 0);
    case 804: return launch<M, 8, 4>(X, Wt, Y, Yf, counters, N, K, c.per_sm, sms, 0);
    case 806: return launch<M, 8, 6>(X, Wt, Y, Yf, counters, N, K, c.per_sm, sms, 0);
    default: return launch<M, 8, 8>(X, Wt, Y, Yf, counters, N, K, c.per_sm, sms, 0);
  }
}

__global__ void fill(bf16 *p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65535.f - 0.5f) * scale);
  }
}

template <int M>
void run_shapes(cublasHandle_t h, int sms) {
  int shapes[][2] = {{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560}};
  const char *names[] = {"qkv", "o", "gate/up", "down", "head"};
  const int COPIES = 6, REPS = 50;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double layer_cublas = 0, layer_ours = 0;
  for (int si = 0; si < 5; si++) {
    const int N = shapes[si][0], K = shapes[si][1];
    const size_t n_w = (size_t)N * K, wbytes = n_w * 2;
    const int copies = wbytes > (200u << 20) ? 1 : COPIES;
    std::vector<bf16 *> W(copies), T4(copies), T8(copies);
    for (int c = 0; c < copies; c++) {
      CK(cudaMalloc(&W[c], wbytes));
      CK(cudaMalloc(&T4[c], wbytes));
      CK(cudaMalloc(&T8[c], wbytes));
      fill<<<1024, 256>>>(W[c], n_w, 17 + c, 0.1f);
      tile_weights<<<2048, 256>>>(W[c], T4[c], N, K, 64);
      tile_weights<<<2048, 256>>>(W[c], T8[c], N, K, 128);
    }
    bf16 *X, *Yref, *Y;
    float *Yf;
    unsigned *counters;
    CK(cudaMalloc(&X, (size_t)M * K * 2));
    CK(cudaMalloc(&Yref, (size_t)M * N * 2));
    CK(cudaMalloc(&Y, (size_t)M * N * 2));
    CK(cudaMalloc(&Yf, (size_t)M * N * 4));
    CK(cudaMalloc(&counters, (size_t)(N / 64) * 4));
    CK(cudaMemset(Yf, 0, (size_t)M * N * 4));
    CK(cudaMemset(counters, 0, (size_t)(N / 64) * 4));
    fill<<<256, 256>>>(X, (size_t)M * K, 99, 2.0f);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const float alpha = 1, beta = 0;
    auto cublas = [&](int i) {
      CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W[i % copies], CUDA_R_16BF, K, X, CUDA_R_16BF, K,
                      &beta, Yref, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    auto time = [&](auto &&f) {
      for (int i = 0; i < 10; i++) f(i);
      CK(cudaEventRecord(e0));
      for (int i = 0; i < REPS; i++) f(i);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      return ms * 1000.0 / REPS;
    };
    const double us_cublas = time(cublas);
    cublas(0);  // the reference, for copy 0
    std::vector<bf16> ref((size_t)M * N), got((size_t)M * N);
    CK(cudaMemcpy(ref.data(), Yref, ref.size() * 2, cudaMemcpyDeviceToHost));
    double best = 1e30, worst_err = 0;
    Config best_c{0, 0, 0};
    for (int warps : {4, 8})
      for (int stages : {4, 6, 8})
        for (int per_sm : {1, 2, 3, 4}) {
          if (N % (16 * warps) != 0) continue;
          const Config c{warps, stages, per_sm};
          std::vector<bf16 *> &T = warps == 4 ? T4 : T8;
          if (!run<M>(c, X, T[0], Y, Yf, counters, N, K, sms)) continue;
          CK(cudaGetLastError());
          CK(cudaDeviceSynchronize());
          // Twice: the second launch checks that the first left the
          // partial-sum buffer and the counters clean.
          CK(cudaMemset(Y, 0, (size_t)M * N * 2));
          run<M>(c, X, T[0], Y, Yf, counters, N, K, sms);
          CK(cudaDeviceSynchronize());
          CK(cudaMemcpy(got.data(), Y, got.size() * 2, cudaMemcpyDeviceToHost));
          double maxref = 0, maxerr = 0;
          for (size_t i = 0; i < got.size(); i++) {
            const double r = __bfloat162float(ref[i]), g = __bfloat162float(got[i]);
            maxref = std::max(maxref, std::fabs(r));
            maxerr = std::max(maxerr, std::fabs(r - g));
          }
          const double rel = maxerr / std::max(maxref, 1e-30);
          worst_err = std::max(worst_err, rel);
          if (rel >= 2e-2)
            printf("  WRONG: %s warps %d stages %d per_sm %d: error %.1e\n", names[si], warps, stages, per_sm, rel);
          const double us = time([&](int i) { run<M>(c, X, T[i % copies], Y, Yf, counters, N, K, sms); });
          if (getenv("SDG_ALL"))
            printf("  %-8s warps %d stages %d per_sm %d: %7.1f us\n", names[si], warps, stages, per_sm, us);
          if (us < best) {
            best = us;
            best_c = c;
          }
        }
    const double ideal = wbytes / 3.35e12 * 1e6;
    printf("M %2d %-8s N %6d K %5d  cublas %7.1f us (%3.0f%%)  ours %7.1f us (%3.0f%%, warps %d, stages %d, %d a SM)  "
           "%.2fx  max err %.1e %s\n",
           M, names[si], N, K, us_cublas, 100 * ideal / us_cublas, best, 100 * ideal / best, best_c.warps,
           best_c.stages, best_c.per_sm, us_cublas / best, worst_err, worst_err < 2e-2 ? "ok" : "WRONG");
    if (si < 4) {
      layer_cublas += us_cublas;
      layer_ours += best;
    }
    for (int c = 0; c < copies; c++) {
      CK(cudaFree(W[c]));
      CK(cudaFree(T4[c]));
      CK(cudaFree(T8[c]));
    }
    CK(cudaFree(X));
    CK(cudaFree(Yref));
    CK(cudaFree(Y));
    CK(cudaFree(Yf));
    CK(cudaFree(counters));
  }
  printf("M %2d layer (four products): cublas %.1f us, ours %.1f us (%.2fx); the bytes at 3.35 TB/s: %.1f us\n", M,
         layer_cublas, layer_ours, layer_cublas / layer_ours,
         (6144.0 * 2560 + 2560.0 * 4096 + 19456.0 * 2560 + 2560.0 * 9728) * 2 / 3.35e12 * 1e6);
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cublasHandle_t h;
  CK(cublasCreate(&h));
  run_shapes<32>(h, prop.multiProcessorCount);
  run_shapes<16>(h, prop.multiProcessorCount);
  return 0;
}
