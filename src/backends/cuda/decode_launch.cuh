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
// With max_carveout, the launch asks for the SMs' largest shared-memory
// carveout (so another kernel's blocks fit beside this one's where its own
// shared memory leaves room).
template <class... Params, class... Args>
cudaError_t launch_overlapped_carveout(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                       cudaStream_t stream, bool overlap, bool max_carveout, Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  unsigned n = 0;
  if (overlap) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (max_carveout) {
    attrs[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attrs[n++].val.sharedMemCarveout = cudaSharedmemCarveoutMaxShared;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = n ? attrs : nullptr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
template <class... Params, class... Args>
cudaError_t launch_overlapped_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                   bool overlap, Args&&... args) {
  return launch_overlapped_carveout(kernel, grid, block, smem, stream, overlap, false, std::forward<Args>(args)...);
}
// The same without dynamic shared memory.
template <class... Params, class... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, bool overlap,
                              Args&&... args) {
  return launch_overlapped_smem(kernel, grid, block, 0, stream, overlap, std::forward<Args>(args)...);
}

// kernel<<<grid, block, 0, stream>>>(args...) in clusters of cluster_x
// blocks along x (at most 8, a portable cluster, unless the kernel allows a
// non-portable size), as a programmatic dependent launch when overlap.
template <class... Params, class... Args>
cudaError_t launch_overlapped_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned cluster_x,
                                      cudaStream_t stream, bool overlap, Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cluster_x;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = overlap ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace lathe::cuda
