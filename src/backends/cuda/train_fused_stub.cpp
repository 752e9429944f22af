// The fused-projection kernels (train_fused.h) in a build without nvcc:
// every call reports that this build has no CUDA.
#include "backends/cuda/train_fused.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

Status qkv_split(CudaContext&, const QkvSplitArgs&) { return no_cuda(); }
Status qkv_merge(CudaContext&, const QkvSplitArgs&) { return no_cuda(); }
Status swiglu_rows_forward(CudaContext&, const SwigluRowsArgs&) { return no_cuda(); }
Status swiglu_rows_backward(CudaContext&, const SwigluRowsBackwardArgs&) { return no_cuda(); }

}  // namespace lathe::cuda
