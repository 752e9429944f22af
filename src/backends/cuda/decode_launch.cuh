// Programmatic dependent launch for the decode kernels (decode_ops.h,
// `overlap`): the host launcher that sets the launch attribute, and the two
// device calls. allow_next_grid() lets the next kernel on the stream start
// once every block of this one has called it; wait_prior_grid() blocks
// until the previous kernel has finished and its writes are visible (it
// returns at once when this kernel was launched the ordinary way). Both are
// no-ops before sm_90. Also the L2 prefetch (L2Prefetch) a decode kernel
// issues for the next one. Not part of the backend's interface.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace lathe::cuda {

__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Block `index` of `count` issuing blocks pulls its share of each region of
// p into L2: pieces of up to 4 KiB, one per thread at a time, each a single
// asynchronous bulk prefetch (nothing to wait for, no registers held). The
// shares are cut at 16-byte units so the blocks cover each region exactly.
template <class Prefetch>
__device__ __forceinline__ void l2_prefetch_share(const Prefetch& p, int64_t index, int64_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int64_t kPiece = 256;  // 16-byte units per prefetch instruction
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t units = p.bytes[r] / 16;
    if (units <= 0) continue;
    const int64_t u0 = units * index / count, u1 = units * (index + 1) / count;
    const char* base = static_cast<const char*>(p.ptr[r]);
    for (int64_t u = u0 + int64_t(threadIdx.x) * kPiece; u < u1; u += int64_t(blockDim.x) * kPiece) {
      const uint32_t size = static_cast<uint32_t>((u1 - u < kPiece ? u1 - u : kPiece) * 16);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + u * 16), "r"(size) : "memory");
    }
  }
#endif
}

// kernel<<<grid, block, 0, stream>>>(args...), as a programmatic dependent
// launch when overlap.
template <class... Params, class... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, bool overlap,
                              Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = overlap ? &attr : nullptr;
  cfg.numAttrs = overlap ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace lathe::cuda
