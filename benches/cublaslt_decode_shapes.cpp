// cuBLAS against cuBLASLt's algorithm search at the decode step's shapes:
// Y[M, N] = X[M, K] W[N, K]^T in bf16 for the Qwen3-4B layer's four products
// (qkv, o, gate/up, down) and the head, M = 16, 32, 64. Each weight is cycled
// through several copies so that L2 holds none (a decode step reads every
// weight once). Prints each product's time with cublasGemmEx (what candle
// calls), with Lt's first heuristic and with the fastest of its up to 64, and
// the share of the card's bandwidth (3.35 TB/s, an H100 SXM) the fastest
// reaches.
//
//   g++ -O2 -I$CUDA_HOME/include benches/cublaslt_decode_shapes.cpp -o lt \
//       -L$CUDA_HOME/lib64 -lcublasLt -lcublas -lcudart
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#define CK(x) do { auto r = (x); if (r != 0) { printf("err %d at %s:%d\n", (int)r, __FILE__, __LINE__); exit(1);} } while (0)
int main() {
  cublasLtHandle_t lt; CK(cublasLtCreate(&lt));
  cublasHandle_t h; CK(cublasCreate(&h));
  size_t wsz = 64 << 20; void *ws; CK(cudaMalloc(&ws, wsz));
  int shapes[][2] = {{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560}};
  const int COPIES = 6;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int M : {16, 32, 64}) {
    double tot_def = 0, tot_best = 0;
    for (auto &s : shapes) {
      int N = s[0], K = s[1];
      int copies = (size_t)N * K * 2 > (200u << 20) ? 1 : COPIES;
      std::vector<void *> W(copies);
      for (auto &w : W) { CK(cudaMalloc(&w, (size_t)N * K * 2)); cudaMemset(w, 0, (size_t)N * K * 2); }
      void *X, *Y; CK(cudaMalloc(&X, (size_t)M * K * 2)); CK(cudaMalloc(&Y, (size_t)M * N * 2));
      cudaMemset(X, 0, (size_t)M * K * 2);
      float alpha = 1, beta = 0;
      const int REPS = 60;
      // default cublasGemmEx
      auto run_def = [&](int i) {
        CK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W[i % copies], CUDA_R_16BF, K, X, CUDA_R_16BF, K,
                        &beta, Y, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      for (int i = 0; i < 10; i++) run_def(i);
      cudaEventRecord(e0); for (int i = 0; i < REPS; i++) run_def(i); cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); double us_def = ms * 1000 / REPS;
      // Lt
      cublasLtMatmulDesc_t op; CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
      cublasLtMatrixLayout_t la, lb, lc;
      CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
      CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
      CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
      cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
      cublasLtMatmulHeuristicResult_t res[64]; int n = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 64, res, &n));
      double best = 1e9; int bi = -1; double first = 0;
      for (int a = 0; a < n; a++) {
        auto run = [&](int i) {
          return cublasLtMatmul(lt, op, &alpha, W[i % copies], la, X, lb, &beta, Y, lc, Y, lc, &res[a].algo, ws, wsz, 0);
        };
        if (run(0) != 0) continue;
        for (int i = 0; i < 5; i++) run(i);
        cudaEventRecord(e0); for (int i = 0; i < REPS; i++) run(i); cudaEventRecord(e1); cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1); double us = ms * 1000 / REPS;
        if (a == 0) first = us;
        if (us < best) { best = us; bi = a; }
      }
      double ideal = (double)N * K * 2 / 3.35e12 * 1e6;
      printf("M=%d N=%d K=%d: gemmEx %.1f us, lt first %.1f, lt best %.1f (algo %d of %d), ideal %.1f -> best %.0f%% of bw\n",
             M, N, K, us_def, first, best, bi, n, ideal, 100 * ideal / best);
      if (N != 151936) { tot_def += us_def; tot_best += best; }
      for (auto &w : W) cudaFree(w); cudaFree(X); cudaFree(Y);
    }
    printf("M=%d layer: gemmEx %.1f us, lt best %.1f us\n", M, tot_def, tot_best);
  }
}
