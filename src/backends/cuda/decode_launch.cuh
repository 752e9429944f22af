// Programmatic dependent launch for the decode kernels (decode_ops.h,
// `overlap`): the host launcher that sets the launch attribute, and the two
// device calls. allow_next_grid() lets the next kernel on the stream start
// once every block of this one has called it; wait_prior_grid() blocks
// until the previous kernel has finished and its writes are visible (it
// returns at once when this kernel was launched the ordinary way). Both are
// no-ops before sm_90. Not part of the backend's interface.
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

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic
// dependent launch when overlap.
template <class... Params, class... Args>
cudaError_t launch_overlapped_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                   bool overlap, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = overlap ? &attr : nullptr;
  cfg.numAttrs = overlap ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
// The same without dynamic shared memory.
template <class... Params, class... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, bool overlap,
                              Args&&... args) {
  return launch_overlapped_smem(kernel, grid, block, 0, stream, overlap, std::forward<Args>(args)...);
}

}  // namespace lathe::cuda
