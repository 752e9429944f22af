// The full-SFT kernels (sft_ops.h) in a build without nvcc: every call
// reports that this build has no CUDA.
#include "backends/cuda/sft_ops.h"

namespace lathe::cuda {
namespace {
Status no_cuda() { return unsupported("cuda: this build of lathe has no CUDA backend (nvcc was not found at build time)"); }
}  // namespace

Status column_grad(CudaContext&, const ColumnGradArgs&) { return no_cuda(); }
Status embedding_grad(CudaContext&, const EmbeddingGradArgs&) { return no_cuda(); }

}  // namespace lathe::cuda
