// Internals shared by the CUDA backend's translation units: the context's
// state (stream, cuBLASLt handle, workspace, GEMM plan cache), the error
// helpers and the small device helpers every kernel uses (bf16 loads, block
// reductions, launch sizing). Not part of the backend's interface.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

inline Status cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return error(StatusCode::kInternal, "cuda: ", what, ": ", cudaGetErrorString(err));
}
inline Status cublas_check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return error(StatusCode::kInternal, "cublasLt: ", what, ": status ", static_cast<int>(st));
}
#define LATHE_CU_TRY(call) LATHE_TRY(::lathe::cuda::cuda_check((call), #call))
#define LATHE_CUBLAS_TRY(call) LATHE_TRY(::lathe::cuda::cublas_check((call), #call))

// One GEMM shape's descriptors and chosen algorithm.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
// m, n, k, trans_a, trans_b, c dtype, accumulate, pointer alignments, row
// strides of A, B and C, epilogue (0 none, 1 bias) and the bias's alignment.
using GemmKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, bool, int, int, int, int64_t, int64_t, int64_t,
                           int, int>;

struct CudaContext::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<GemmKey, GemmPlan> plans;
  ~Impl();
};

inline cudaStream_t stream_of(const CudaContext& ctx) { return ctx.impl()->stream; }

// Blocks for n elements at `threads` per block (at least one).
inline unsigned blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace lathe::cuda

#ifdef __CUDACC__
namespace lathe::cuda::dev {

__device__ __forceinline__ float ld(const bf16_bits* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ void st(bf16_bits* p, int64_t i, float x) {
  reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
}

// The splitmix64 finalizer: a well-mixed 64-bit hash, the same on every
// platform (random fills, dropout masks, the draws of sample_pick).
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the total. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  x = warp_sum(x);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < n_warps ? scratch[lane] : 0.0f;
  return warp_sum(x);
}
__device__ __forceinline__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < n_warps ? scratch[lane] : -INFINITY;
  return warp_max(x);
}

}  // namespace lathe::cuda::dev
#endif
